//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/registry/migrate"
	"github.com/clustermap/clustermap/test/harness"
)

// TestMoveFromCloudMapToHub takes docs/hub.md's steps for moving a
// clusterset from Cloud Map to a hub, one cluster at a time, while
// cluster-2 samples its import of cluster-1's Service every 100 ms: no
// sample misses an endpoint. Cloud Map holds nothing of the Service once
// cluster-1 left it, and the moved clusterset imports through the hub.
func TestMoveFromCloudMapToHub(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	w.joinHub(t)
	const ns, name = "move", "web"
	w.allNamespaces(t, ns)
	// Each cluster's controller, restarted at each step as its flags say.
	stops := make([]func(), len(w.env.Clusters))
	run := func(i int, step string, tune func(*controller.Options)) {
		t.Helper()
		if stops[i] != nil {
			stops[i]()
		}
		t.Logf("%s: %s", w.env.Clusters[i].ID, step)
		stops[i] = w.startControllersIn(t, []*devenv.Cluster{w.env.Clusters[i]}, tune)
	}
	t.Cleanup(func() {
		for _, stop := range stops {
			if stop != nil {
				stop()
			}
		}
	})
	onCloudMap := func(o *controller.Options) { o.HubKubeconfig = "" }
	moving := func(phase migrate.Phase) func(*controller.Options) {
		return func(o *controller.Options) { o.MigratingFrom, o.MigrationPhase = registry.CloudMap, phase }
	}
	for i := range w.env.Clusters {
		run(i, "on Cloud Map", onCloudMap)
	}
	ips := w.exportApp(t, ns, name, 2)

	done := keepsImport(t, w.clients[1], ns, name, ips)
	run(0, "writes both", moving(migrate.Both))
	w.hubHolds(t, ns, name, "cluster-1")
	run(1, "writes both", moving(migrate.Both))
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
	run(0, "leaves Cloud Map", moving(migrate.Leaving))
	w.cloudMapClean(t, ns)
	run(1, "leaves Cloud Map", moving(migrate.Leaving))
	for i := range w.env.Clusters {
		run(i, "on the hub", nil)
	}
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
	done()

	// Through the hub alone: a change arrives.
	harness.Scale(t, w.clients[0], ns, name, 3)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", waitPods(t, w.clients[0], ns, name, 3))
}

// hubHolds waits until the hub holds a cluster's export of a service.
func (w *world) hubHolds(t *testing.T, ns, name, cluster string) {
	t.Helper()
	c := harness.ClientWith(t, w.hub.Config, hub.Scheme())
	harness.Eventually(t, importDeadline, fmt.Sprintf("the hub holds %s's export of %s/%s", cluster, ns, name), func() error {
		list := &hubv1alpha1.ClusterExportList{}
		if err := c.List(context.Background(), list, client.InNamespace(hub.Namespace(w.env.ClusterSet))); err != nil {
			return err
		}
		for _, x := range list.Items {
			if x.Spec.Cluster == cluster && x.Spec.Service.Namespace == ns && x.Spec.Service.Name == name {
				return nil
			}
		}
		return fmt.Errorf("%d exports, none of it", len(list.Items))
	})
}
