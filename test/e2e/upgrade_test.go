//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	helmrelease "helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/test/harness"
)

// previousRelease is the commit v0.1.0 was cut at (its CHANGELOG section
// and chart version were written there).
const previousRelease = "6dd25ef"

// docs/install.md's upgrade, run as written on a release of the previous
// release's chart installed as its docs said: the CRDs applied first, then
// helm upgrade --reset-then-reuse-values with this chart. The release is
// deployed with the values set at install kept and this chart's new
// defaults taken (values v0.1.0 never had), and the controller runs.
func TestUpgradeFromPreviousChart(t *testing.T) {
	inParallel(t)
	dir := t.TempDir()
	// The chart as v0.1.0 shipped it, from this clone's history.
	if out, err := exec.Command("bash", "-c", "git -C ../.. archive "+previousRelease+" charts/clustermap | tar -x -C "+dir).CombinedOutput(); err != nil {
		t.Fatalf("v0.1.0's chart from git (%s; a clone with its history is needed): %v\n%s", previousRelease, err, out)
	}
	old, err := loader.Load(filepath.Join(dir, "charts", "clustermap"))
	harness.Must(t, err)
	if old.Metadata.Version != "0.1.0" {
		t.Fatalf("the chart at %s is version %s, want 0.1.0", previousRelease, old.Metadata.Version)
	}
	env := harness.Clusters(t, 1)
	c := env.Clusters[0]
	ctx := context.Background()
	cl := harness.Client(t, c.Config)

	// A cluster as v0.1.0's install found it: no ClusterProperties yet
	// (that chart makes them, and refuses ones it does not hold).
	for _, name := range []string{"cluster.clusterset.k8s.io", "clusterset.k8s.io"} {
		p := &aboutv1alpha1.ClusterProperty{}
		p.Name = name
		harness.Must(t, client.IgnoreNotFound(cl.Delete(ctx, p)))
	}
	install := codeBlock(t, "../../docs/install.md", "helm install clustermap oci://")
	values, ns := helmFlags(t, install)
	cfg := helmAction(t, env, c, ns)
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = release, ns, true
	if _, err := in.RunWithContext(ctx, old, values); err != nil {
		t.Fatalf("v0.1.0's chart, installed as docs/install.md says: %v", err)
	}

	steps := strings.Split(strings.TrimSpace(codeBlock(t, "../../docs/install.md", "--reset-then-reuse-values\n")), "\n")
	if len(steps) != 3 || !strings.HasPrefix(steps[0], "kubectl apply --server-side --force-conflicts -f charts/clustermap/crds/") ||
		!strings.HasPrefix(steps[1], "helm upgrade clustermap oci://") || strings.TrimSpace(steps[2]) != "-n clustermap-system --reset-then-reuse-values" {
		t.Fatalf("docs/install.md's upgrade changed (%q): bring this test to it", steps)
	}
	t.Log(shell(t, env, strings.TrimSpace(strings.Split(steps[0], "#")[0])))
	set, upNS := helmFlags(t, steps[1]+"\n"+steps[2])
	up := action.NewUpgrade(cfg)
	up.Namespace, up.ResetThenReuseValues = upNS, true
	rel, err := up.RunWithContext(ctx, release, loadChart(t), set)
	if err != nil {
		t.Fatalf("docs/install.md's upgrade from v0.1.0: %v", err)
	}
	if rel.Info.Status != helmrelease.StatusDeployed || rel.Chart.Metadata.Version == "" {
		t.Errorf("after the upgrade: %s", rel.Info.Status)
	}
	// The values set at install are kept.
	for key, want := range map[string]string{"region": "us-west-2", "clusterProperties.clusterId": "cls1"} {
		if got, _, _ := unstructured.NestedString(rel.Config, strings.Split(key, ".")...); got != want {
			t.Errorf("%s after the upgrade: %q, want %q as installed", key, got, want)
		}
	}
	// This chart's new defaults are taken: the controller's priority class
	// and its PodDisruptionBudget's maxUnavailable (v0.1.0 had neither).
	d := &appsv1.Deployment{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: release + "-controller"}, d))
	if p := d.Spec.Template.Spec.PriorityClassName; p != "system-cluster-critical" {
		t.Errorf("the controller's priority class after the upgrade: %q, want this chart's default", p)
	}
	pdb := &policyv1.PodDisruptionBudget{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: release + "-controller"}, pdb))
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MinAvailable != nil {
		t.Errorf("the PodDisruptionBudget after the upgrade: %+v, want this chart's maxUnavailable", pdb.Spec)
	}
	harness.Eventually(t, time.Minute, "the upgraded controller's pods running", func() error {
		pods := &corev1.PodList{}
		if err := cl.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "clustermap-controller"}); err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.PriorityClassName == "system-cluster-critical" {
				running++
			}
		}
		if running == 0 {
			return fmt.Errorf("%d pods, none of this chart running: see the ReplicaSets' events", len(pods.Items))
		}
		return nil
	})
}
