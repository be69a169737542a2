//go:build linux && e2e

package devenv_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
	"github.com/clustermap/clustermap/test/harness"
)

// `clustermap-dev up --hub`: a hub beside two members, in the kubeconfig as
// context hub, initialised for the clusterset, with no member identity;
// each member's hub kubeconfig writes its own exports, which the other
// hears. Down stops the hub too.
func TestUpWithHub(t *testing.T) {
	var pids []int
	t.Run("lab", func(t *testing.T) {
		env := harness.ClustersWith(t, devenv.Options{Clusters: 2, Hub: true})
		pids = env.Pids()
		if env.HubCluster == nil || len(env.HubKubeconfigs) != 2 {
			t.Fatalf("hub %v, member kubeconfigs %v", env.HubCluster, env.HubKubeconfigs)
		}
		kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
		harness.Must(t, err)
		if kc.Contexts["hub"] == nil {
			t.Error("the kubeconfig has no context hub")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		admin := harness.Client(t, env.HubCluster.Config)
		if err := admin.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, &aboutv1alpha1.ClusterProperty{}); err == nil {
			t.Error("the hub has a cluster id: it is no member")
		}
		member := func(id string) *hub.Registry {
			data, err := clientcmd.RESTConfigFromKubeConfig(mustRead(t, env.HubKubeconfigs[id]))
			harness.Must(t, err)
			r, err := hub.New(data, hub.Options{ClusterSet: env.ClusterSet, Cluster: id})
			harness.Must(t, err)
			return r
		}
		e := registrytest.Export(env.ClusterSet, "cluster-1", 2)
		harness.Must(t, member("cluster-1").Publish(ctx, e))
		heard := make(chan []registry.Export, 16)
		go func() {
			_ = member("cluster-2").Watch(ctx, registry.SinkFuncs{OnSet: func(_ registry.Key, exports []registry.Export) { heard <- exports }})
		}()
		select {
		case got := <-heard:
			if len(got) != 1 || got[0].Cluster != "cluster-1" || len(got[0].Endpoints) != len(e.Endpoints) {
				t.Errorf("cluster-2 heard %v", got)
			}
		case <-ctx.Done():
			t.Fatal("cluster-2 heard nothing of cluster-1's export")
		}
	})
	for _, p := range pids {
		if devenv.Alive(p) {
			t.Errorf("process %d still runs after the environment stopped", p)
		}
	}
	if len(pids) < 2*5+5 {
		t.Errorf("%d processes, want 5 a cluster, the hub's too", len(pids))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(fmt.Errorf("reading %s: %w", path, err))
	}
	return data
}
