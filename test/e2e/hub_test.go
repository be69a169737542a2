//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/test/harness"
)

// TestMCSOverHub runs the Multi-Cluster Services scenarios that hold for
// any registry with a hub cluster as the registry in place of Cloud Map:
// three members, each controller with the kubeconfig clustermap hub join
// gave it (under the hub's admission policy), and no Cloud Map at all.
func TestMCSOverHub(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 3}, Hub: true})
	t.Cleanup(w.startControllers(t, nil))
	t.Run("ClusterSetIP export is imported into every cluster", w.clusterSetIP)
	// Before the scenarios that leave refused exports and conflicts, which
	// status rightly reports.
	t.Run("clustermap status reads the hub registry", w.hubStatus)
	t.Run("headless export keeps hostnames", w.headless)
	t.Run("scaling is reflected in every cluster", w.scaling)
	t.Run("exports of two clusters are merged", w.twoExporters)
	t.Run("port and type conflicts: the oldest wins", w.conflicts)
	t.Run("differing port sets, labels and annotations", w.differingSets)
	t.Run("a dual-stack export", w.dualStack)
	t.Run("unexport removes imports and cleans the hub", w.unexport)
	t.Run("ExternalName and missing Services are rejected", w.invalid)
	t.Run("a namespace missing in a cluster is imported once created", w.lateNamespace)
}

// hubStatus: `clustermap status` shows each controller's reads of the hub
// and every member's proof of life, and finds nothing stuck.
func (w *world) hubStatus(t *testing.T) {
	harness.Eventually(t, time.Minute, "status over the hub", func() error {
		clusters, err := statusJSON(t, w)
		if err != nil {
			return err
		}
		for i, c := range clusters {
			id := w.env.Clusters[i].ID
			if c.Controller == nil || c.Controller.Sources[statuslease.HubSource].LastSync == nil {
				return fmt.Errorf("%s: controller %+v: no read of the hub", id, c.Controller)
			}
			if len(c.Stuck) > 0 {
				return fmt.Errorf("%s: stuck %v", id, c.Stuck)
			}
		}
		out, err := statusOf(t, w, "table")
		if err != nil || !strings.Contains(out, "hub registry: last sync 20") {
			return fmt.Errorf("status text: %v\n%s", err, out)
		}
		return nil
	})
}

// joinHub starts a hub cluster, initialised for the members' clusterset,
// and joins every member: their controllers get its kubeconfig.
func (w *world) joinHub(t *testing.T) {
	t.Helper()
	w.hub, w.hubKubeconfigs = harness.Clusters(t, 1).Clusters[0], map[string]string{}
	ctx := context.Background()
	harness.Must(t, hub.Init(ctx, w.hub.Config, w.env.ClusterSet))
	dir := t.TempDir()
	for _, c := range w.env.Clusters {
		data, _, err := hub.Join(ctx, w.hub.Config, w.env.ClusterSet, c.ID, "", "", time.Hour)
		harness.Must(t, err)
		path := filepath.Join(dir, c.ID+".kubeconfig")
		harness.Must(t, os.WriteFile(path, data, 0o600))
		w.hubKubeconfigs[c.ID] = path
	}
}

// hubClean waits until the hub holds no export of a service.
func (w *world) hubClean(t *testing.T, ns, name string) {
	t.Helper()
	c := harness.ClientWith(t, w.hub.Config, hub.Scheme())
	harness.Eventually(t, importDeadline, "the hub cleaned", func() error {
		list := &hubv1alpha1.ClusterExportList{}
		if err := c.List(context.Background(), list, client.InNamespace(hub.Namespace(w.env.ClusterSet)),
			client.MatchingLabels{hubv1alpha1.ServiceNamespaceLabel: ns, hubv1alpha1.ServiceNameLabel: name}); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d ClusterExports of %s/%s left on the hub", len(list.Items), ns, name)
		}
		return nil
	})
}

// TestHubDeadMemberDrained: over a hub, at the shipped settings (30 s
// Lease renewals, 2 min --silent-cluster-ttl), a member whose controller
// stops is drained from the other's import (kept, not routed to), and
// routed to again once its controller is back.
func TestHubDeadMemberDrained(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}, Hub: true})
	t.Cleanup(w.startControllersIn(t, w.env.Clusters[:1], nil))
	stop2 := w.startControllersIn(t, w.env.Clusters[1:], nil)
	const ns, name = "dead", "web"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
		app(t, cl, ns, name, 2, false, httpPort(80, 8080))
		exportService(t, cl, ns, name)
	}
	ips1 := waitPods(t, w.clients[0], ns, name, 2)
	ips2 := waitPods(t, w.clients[1], ns, name, 2)
	all := append(slices.Clone(ips1), ips2...)
	slices.Sort(all)
	w.importedEverywhere(t, time.Minute, ns, name, "cluster-1,cluster-2", all)

	stop2()
	stopped := time.Now()
	drained := func(want bool) func() error {
		return func() error {
			si, err := getImport(w.clients[0], ns, name)
			if err != nil {
				return err
			}
			c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionClustersDrained)
			if got := c != nil && c.Status == metav1.ConditionTrue; got != want {
				return fmt.Errorf("ClustersDrained %v, want %v", c, want)
			}
			sl, err := importSlices(w.clients[0], ns, name)
			if err != nil {
				return err
			}
			ready := readyIPs(sl)
			for _, ip := range ips2 {
				if slices.Contains(ready, ip) != !want {
					return fmt.Errorf("cluster-2's %s ready %v in %v", ip, !want, ready)
				}
			}
			for _, ip := range ips1 {
				if !slices.Contains(ready, ip) {
					return fmt.Errorf("cluster-1's own %s not ready: %v", ip, ready)
				}
			}
			return nil
		}
	}
	harness.Eventually(t, hub.DefaultSilentAfter+2*time.Minute, "cluster-2 drained in cluster-1", drained(true))
	t.Logf("cluster-2 drained in cluster-1 %v after its controller stopped", time.Since(stopped).Round(time.Second))
	// Told on cluster-1's ClusterProperty (cluster-scoped: its Events are
	// in default), naming the registry the silent cluster lost.
	harness.Eventually(t, time.Minute, "a ClusterDrained Event naming the hub", wantEvent(w.clients[0], metav1.NamespaceDefault,
		aboutv1alpha1.ClusterIDProperty, "ClusterDrained", corev1.EventTypeWarning, "lost access to the hub"))
	t.Cleanup(w.startControllersIn(t, w.env.Clusters[1:], nil))
	back := time.Now()
	harness.Eventually(t, 2*time.Minute, "cluster-2 routed to again", drained(false))
	t.Logf("cluster-2 routed to again %v after its controller restarted", time.Since(back).Round(time.Second))
}

// TestVerifyOverHub: `clustermap verify` on two members whose registry is
// a hub, with a data plane: its probe exports go through the hub, and
// every check passes, both families, each cluster importing both.
func TestVerifyOverHub(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, Dataplane: true, AllPods: true}, Hub: true})
	t.Cleanup(w.startControllers(t, nil))
	w.verifyPasses(t)
}
