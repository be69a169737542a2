//go:build e2e

package e2e

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/clustermap/clustermap/test/harness"
)

// What `kubectl apply -k` does on a fresh cluster: kustomize builds the
// tree, the apiserver validates and stores every object in kustomize's
// order. config/dns goes for real first (it brings its namespace); every
// other tree is a server-side dry run (RBAC rules, Deployment, CRDs
// validated, nothing stored).
func TestKustomizeApplies(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	cl := harness.Client(t, env.Clusters[0].Config)
	ctx := context.Background()
	apply := func(dir string, opts ...client.PatchOption) map[string]int {
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		kinds := map[string]int{}
		for _, r := range res.Resources() {
			m, err := r.Map()
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{Object: m}
			kinds[u.GetKind()]++
			if u.GetKind() == "ClusterRole" {
				kinds["ClusterRole/"+u.GetName()]++
			}
			if err := cl.Patch(ctx, u, client.Apply, append(opts, client.FieldOwner("kustomize-test"), client.ForceOwnership)...); err != nil {
				t.Errorf("%s: %s %s: %v", dir, u.GetKind(), u.GetName(), err)
			}
		}
		t.Logf("%s: %v", dir, kinds)
		return kinds
	}
	if k := apply("../../config/dns"); k["Namespace"] != 1 || k["Deployment"] != 1 || k["Service"] != 1 || k["ClusterRole"] != 1 || k["PodDisruptionBudget"] != 1 {
		t.Errorf("config/dns is missing pieces: %v", k)
	}
	if k := apply("../../config/default", client.DryRunAll); k["CustomResourceDefinition"] != 3 || k["ClusterRole"] != 4 || k["ClusterRole/clustermap-mcs"] != 1 ||
		k["ClusterRole/clustermap-edit"] != 1 || k["ClusterRole/clustermap-view"] != 1 || k["ClusterRole/clustermap-metrics-reader"] != 1 ||
		k["Deployment"] != 1 || k["PodDisruptionBudget"] != 1 || k["ConfigMap"] != 1 {
		t.Errorf("config/default (MCS) is missing pieces: %v", k)
	}
	// Each mode's, namespace creation's, and the two aggregated into
	// edit/admin and view.
	if k := apply("../../config/examples/all-modes", client.DryRunAll); k["ClusterRole"] != 7 || k["ClusterRoleBinding"] != 4 || k["ClusterRole/clustermap-syndicate-create-namespaces"] != 1 {
		t.Errorf("every mode should bring its ClusterRole and binding: %v", k)
	}
	if k := apply("../../config/examples/cloudmap-dns-only", client.DryRunAll); k["ClusterRole"] != 4 || k["ClusterRole/clustermap-cloudmap-dns"] != 1 || k["ClusterRole/clustermap-mcs"] != 0 {
		t.Errorf("Cloud Map DNS only should bring its ClusterRole only (and the aggregated two): %v", k)
	}
	apply("../../config/samples", client.DryRunAll)
}
