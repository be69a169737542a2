package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
)

// What `kubectl apply -k config/default --dry-run=server` does: kustomize
// builds the tree, the apiserver validates every object (RBAC rules,
// Deployment, CRDs) without storing it.
func TestKustomizeAppliesWithServerDryRun(t *testing.T) {
	env := devenv.ForTest(t, 1)
	cl, err := client.New(env.Clusters[0].Config, client.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Like kubectl, a dry run cannot create objects in a namespace that does
	// not exist yet.
	mustDo(t, cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clustermap-system"}}))
	for _, dir := range []string{"../../config/default", "../../config/samples", "../../config/dns"} {
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
			if err := cl.Patch(ctx, u, client.Apply, client.DryRunAll, client.FieldOwner("dry-run-test"), client.ForceOwnership); err != nil {
				t.Errorf("%s: %s %s: %v", dir, u.GetKind(), u.GetName(), err)
			}
		}
		t.Logf("%s: %v", dir, kinds)
		if dir == "../../config/default" && (kinds["CustomResourceDefinition"] != 3 || kinds["ClusterRole"] != 1 || kinds["Deployment"] != 1) {
			t.Errorf("config/default is missing pieces: %v", kinds)
		}
		if dir == "../../config/dns" && (kinds["Deployment"] != 1 || kinds["Service"] != 1 || kinds["ClusterRole"] != 1) {
			t.Errorf("config/dns is missing pieces: %v", kinds)
		}
	}
}
