//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	helmrelease "helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/test/harness"
)

// The chart's hooks, run by Helm's own actions in a cluster whose pods run
// (the lab's data plane runs the chart's image as clustermap, with the
// pod's service account): helm test runs `clustermap status` in the
// cluster and passes; helm uninstall first runs `clustermap uninstall`,
// which has the export withdrawn from Cloud Map while the controller still
// runs, so that nothing is left holding a finalizer and no record stays,
// and leaves the user's ServiceExport where it is.
// The controller runs on the host; the chart's Deployment stands for it
// (its pods are simulated: only the hooks' pods run), and the hook scales
// it down all the same.
func TestChartHooks(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 1, Dataplane: true}, Controllers: true})
	ctx := context.Background()
	c, cl := w.env.Clusters[0], w.clients[0]
	namespace(t, cl, "shop")
	w.exportApp(t, "shop", "web", 2)
	if n := instanceCount(t, w.cloudMap(t)); n == 0 {
		t.Fatal("nothing in Cloud Map to withdraw")
	}

	cfg := helmAction(t, w.env, c, releaseNS)
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace, in.SkipCRDs = release, releaseNS, true, true
	values := map[string]any{"region": "us-west-2",
		"hookPodAnnotations": map[string]any{"dev.clustermap.io/dataplane": "true"}}
	_, err := in.RunWithContext(ctx, loadChart(t), values)
	harness.Must(t, err)

	// helm test
	rt := action.NewReleaseTesting(cfg)
	rt.Namespace, rt.Timeout = releaseNS, 2*time.Minute
	rel, err := rt.Run(release)
	var logs strings.Builder
	if rel != nil {
		_ = rt.GetPodLogs(&logs, rel)
	}
	if err != nil {
		t.Fatalf("helm test: %v\n%s", err, logs.String())
	}
	tested := false
	for _, h := range rel.Hooks {
		if h.Kind == "Pod" {
			tested = true
			if h.LastRun.Phase != helmrelease.HookPhaseSucceeded {
				t.Errorf("test pod %s: %s", h.Name, h.LastRun.Phase)
			}
		}
	}
	if !tested || !strings.Contains(logs.String(), "shop/web") {
		t.Errorf("helm test ran no pod, or its clustermap status did not list the export shop/web:\n%s", logs.String())
	}
	// Its ServiceAccount and roles went once it passed.
	if err := cl.Get(ctx, client.ObjectKey{Name: release + "-test"}, &rbacv1.ClusterRole{}); !apierrors.IsNotFound(err) {
		t.Errorf("the test's ClusterRole is left after it passed (%v)", err)
	}

	// helm uninstall, hooks on as the helm CLI runs them.
	un := action.NewUninstall(cfg)
	un.Timeout = 5 * time.Minute
	if _, err := un.Run(release); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	// The user's ServiceExport stays, let go of and saying why.
	exports := &mcsv1beta1.ServiceExportList{}
	harness.Must(t, cl.List(ctx, exports))
	if len(exports.Items) != 1 {
		t.Errorf("%d ServiceExports after helm uninstall, want the user's shop/web kept", len(exports.Items))
	}
	for _, se := range exports.Items {
		if len(se.Finalizers) > 0 {
			t.Errorf("ServiceExport %s/%s keeps finalizers %v", se.Namespace, se.Name, se.Finalizers)
		}
		if c := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady)); c == nil || c.Reason != string(export.ReasonWithdrawn) {
			t.Errorf("ServiceExport %s/%s Ready %+v, want False/%s", se.Namespace, se.Name, c, export.ReasonWithdrawn)
		}
	}
	svcs := &corev1.ServiceList{}
	harness.Must(t, cl.List(ctx, svcs))
	for _, s := range svcs.Items {
		for _, f := range s.Finalizers {
			if strings.Contains(f, "clustermap") {
				t.Errorf("Service %s/%s keeps finalizer %s", s.Namespace, s.Name, f)
			}
		}
	}
	if n := instanceCount(t, w.cloudMap(t)); n != 0 {
		t.Errorf("%d Cloud Map instances left after helm uninstall", n)
	}
	hook := metav1.ObjectMeta{Namespace: releaseNS, Name: release + "-uninstall"}
	for _, o := range []client.Object{&corev1.ServiceAccount{ObjectMeta: hook}, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: hook.Name}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: hook.Name}}} {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("the uninstall hook's %T is left (%v)", o, err)
		}
	}
	if _, err := action.NewGet(cfg).Run(release); err == nil {
		t.Error("the release is still there")
	}
}
