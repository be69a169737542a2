//go:build e2e

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkSyndicate: 3 clusters replicating to each other, 500 Services
// of 2 pods in cluster-1. Prints the time from a new pod's address in the
// source cluster's EndpointSlice to clustermap's EndpointSlices in both
// peers. Target: p99 under 1 s.
func BenchmarkSyndicate(b *testing.B) {
	const namespaces, perNamespace, replicas = 5, 100, 2
	const services = namespaces * perNamespace
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := harness.Clusters(b, 3)
	// Peers reach each other as `clustermap peer-kubeconfig` grants, every namespace.
	dirs, err := env.PeerDirs(ctx, b.TempDir(), replication.PeerAccess{})
	if err != nil {
		b.Fatal(err)
	}
	cm := harness.CloudMap(b, cloudmaplocal.Options{}) // unused by this mode; StartControllers wants an endpoint
	wait := env.StartControllers(ctx, cm.URL, func(*devenv.Cluster) logr.Logger { return logr.Discard() }, func(o *controller.Options) {
		for _, c := range env.Clusters {
			if c.Config == o.Config {
				o.ClusterName, o.PeersDir = c.ID, dirs[c.ID]
			}
		}
		o.MCS, o.Syndicate, o.CreateNamespaces = false, true, true
	})
	defer func() { cancel(); _ = wait() }()
	src := harness.Client(b, env.Clusters[0].Config)
	type key struct{ ns, name string }
	var keys []key
	for n := 0; n < namespaces; n++ {
		ns := fmt.Sprintf("bench-%d", n)
		if err := src.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		for s := 0; s < perNamespace; s++ {
			name := fmt.Sprintf("svc-%d", s)
			keys = append(keys, key{ns, name})
			createApp(ctx, b, src, ns, name, replicas, nil)
		}
	}
	source := track(ctx, b, env.Clusters[0], "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName)
	peers := []*importTracker{
		track(ctx, b, env.Clusters[1], replication.ManagedBy, discoveryv1.LabelServiceName),
		track(ctx, b, env.Clusters[2], replication.ManagedBy, discoveryv1.LabelServiceName),
	}
	// Everything replicated before the clock starts.
	setup := time.Now()
	for done := 0; done < services; {
		done = 0
		for _, k := range keys {
			svc := k.ns + "/" + k.name
			if len(source.ips(svc)) == replicas && len(peers[0].ips(svc)) == replicas && len(peers[1].ips(svc)) == replicas {
				done++
			}
		}
		if time.Since(setup) > 10*time.Minute {
			b.Fatalf("%d of %d Services replicated", done, services)
		}
		time.Sleep(500 * time.Millisecond)
	}
	b.Logf("%d Services x %d pods replicated to 2 peers %v after creation", services, replicas, time.Since(setup).Round(time.Second))
	b.ResetTimer()

	// One more pod for 100 Services in turn, at random gaps.
	var lat []time.Duration
	for i := 0; i < 100; i++ {
		k := keys[i*len(keys)/100]
		svc := k.ns + "/" + k.name
		ip, seen := addPod(ctx, b, src, source, k.ns, k.name)
		for !peers[0].ips(svc)[ip] || !peers[1].ips(svc)[ip] {
			if time.Since(seen) > time.Minute {
				b.Fatalf("%s of %s not in both peers a minute after it appeared", ip, svc)
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(seen))
		time.Sleep(time.Duration(rand.Float64() * float64(200*time.Millisecond)))
	}
	b.StopTimer()
	fmt.Printf("Direct replication (syndicate), 3 clusters, %d Services x %d pods in cluster-1, %d cores:\n", services, replicas, runtimeCores())
	fmt.Printf("  new pod in the source EndpointSlice -> clustermap's EndpointSlice in both peers (100 changes): p50 %v  p99 %v  max %v\n",
		percentile(lat, 50).Round(time.Millisecond), percentile(lat, 99).Round(time.Millisecond), percentile(lat, 100).Round(time.Millisecond))
	b.ReportMetric(float64(percentile(lat, 99).Milliseconds()), "podchange-p99-ms")
}
