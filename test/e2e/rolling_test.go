//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// TestRollingUpgradeDrainsNothing: at the shipped liveness settings (a
// heartbeat every 30 s, a silent-cluster TTL of 2 minutes), cluster-1's
// controller is replaced the way a Deployment's rolling update replaces
// it: a new replica starts beside the leader, the old one stops, the new
// one takes the lease. cluster-2, which exports the Service too (so a
// drain of cluster-1 would take effect: the last exporters are never
// drained), keeps cluster-1's endpoints ready, and no ClustersDrained
// condition, through the hand-over and for a TTL and two heartbeats after.
func TestRollingUpgradeDrainsNothing(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	ctx := context.Background()
	replica := func(id string) func(*controller.Options) {
		return func(o *controller.Options) {
			o.LeaderElect, o.LeaderElectionNamespace, o.LeaderElectionIdentity = true, kube.DefaultStatusNamespace, id
		}
	}
	const ns, name = "roll", "web"
	for _, cl := range w.clients {
		namespace(t, cl, kube.DefaultStatusNamespace)
		namespace(t, cl, ns)
	}
	t.Cleanup(w.startControllersIn(t, w.env.Clusters[1:], replica("cluster-2-a")))
	old := w.startControllersIn(t, w.env.Clusters[:1], replica("cluster-1-old"))
	started := time.Now()
	for _, cl := range w.clients {
		app(t, cl, ns, name, 2, false, httpPort(80, 8080))
		exportService(t, cl, ns, name)
	}
	ips1 := waitPods(t, w.clients[0], ns, name, 2)
	all := append(slices.Clone(ips1), waitPods(t, w.clients[1], ns, name, 2)...)
	slices.Sort(all)
	w.importedEverywhere(t, time.Minute, ns, name, "cluster-1,cluster-2", all)
	// cluster-2 has read a heartbeat of cluster-1's (its second record
	// write): a record first seen proves alive then anyway.
	if wait := time.Until(started.Add(cloudmap.MinHeartbeat + 10*time.Second)); wait > 0 {
		time.Sleep(wait)
	}

	// The rolling update: the new replica beside the old, then the old
	// one gone (maxSurge 1, maxUnavailable 0).
	stopNew := w.startControllersIn(t, w.env.Clusters[:1], replica("cluster-1-new"))
	t.Cleanup(stopNew)
	time.Sleep(5 * time.Second)
	old()
	stopped := time.Now()
	harness.Eventually(t, time.Minute, "the new replica leads", func() error {
		l := &coordinationv1.Lease{}
		if err := w.clients[0].Get(ctx, client.ObjectKey{Namespace: kube.DefaultStatusNamespace, Name: controller.LeaderElectionID}, l); err != nil {
			return err
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "cluster-1-new" {
			return fmt.Errorf("held by %q", h)
		}
		return nil
	})
	t.Logf("the new replica leads %v after the old one stopped", time.Since(stopped).Round(100*time.Millisecond))

	// Watched every second for a TTL and two heartbeats after the old
	// replica stopped: long enough for a drain to show.
	until := stopped.Add(cloudmap.DefaultSilentAfter + 2*cloudmap.MinHeartbeat)
	for time.Now().Before(until) {
		si, err := getImport(w.clients[1], ns, name)
		harness.Must(t, err)
		if c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionClustersDrained); c != nil && c.Status == metav1.ConditionTrue {
			t.Fatalf("%v after the old replica stopped, cluster-2 drained: %s", time.Since(stopped).Round(time.Second), c.Message)
		}
		sl, err := importSlices(w.clients[1], ns, name)
		harness.Must(t, err)
		ready := readyIPs(sl)
		for _, ip := range ips1 {
			if !slices.Contains(ready, ip) {
				t.Fatalf("%v after the old replica stopped, cluster-2's import lacks cluster-1's ready %s: %v", time.Since(stopped).Round(time.Second), ip, ready)
			}
		}
		time.Sleep(time.Second)
	}
}
