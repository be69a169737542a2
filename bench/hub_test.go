//go:build e2e

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkHubFleet: the fleet of BenchmarkFleet (shape: 50 clusters x
// 1,000 services by default, CLUSTERMAP_FLEET scales it) with a hub
// cluster as the registry: one kwok cluster's real kube-apiserver and
// etcd, initialised by hub init, each member writing with the expiring
// kubeconfig hub join gave it (under the admission policy), at the
// shipped settings (the member client's rate, 30 s Lease renewals).
//
// Two members import as the controller does (hub.Registry's watch, its
// cache of every ClusterExport and Lease); every other member renews its
// Lease and holds the same two watches open, counting the bytes and
// discarding them: the hub's fan-out is the whole fleet's, while this
// process holds two importers' caches, not 50 (about 2 GB each at the
// full shape). It prints the fleet's first publish, the last member's
// bulk export to both importers, a pod change's propagation (p50, p99;
// CLUSTERMAP_BENCH_CHANGES of them, 50 by default), and, idle over
// CLUSTERMAP_BENCH_WINDOW (1 minute by default), the requests a second
// the hub serves and the bytes a second each member's watches carry; last
// the hub's objects and etcd size. Pod change p99 is held to its target:
// under 1 s at 2 clusters, under 2 s at more.
func BenchmarkHubFleet(b *testing.B) {
	s := shape(b)
	changes, window := fleetRun(b)
	ctrllog.SetLogger(harness.HeldLog(b))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := harness.Clusters(b, 1).Clusters[0].Config
	harness.Must(b, hub.Init(ctx, admin, fleetClusterSet))
	ns := hub.Namespace(fleetClusterSet)

	importers := min(2, s.clusters-1)
	var calls atomic.Int64 // the members' requests to the hub, watches aside
	members := make([]*hub.Registry, s.clusters)
	var watched []*atomic.Int64 // the bytes each watching member's streams carried
	var ims []*fleetMember
	for c := range s.clusters {
		name := fmt.Sprintf("cluster-%02d", c)
		data, _, err := hub.Join(ctx, admin, fleetClusterSet, name, "", "", time.Hour)
		harness.Must(b, err)
		cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
		harness.Must(b, err)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countCalls{rt, &calls} })
		members[c], err = hub.New(cfg, hub.Options{ClusterSet: fleetClusterSet, Cluster: name})
		harness.Must(b, err)
		if c < importers {
			m := &fleetMember{seen: map[registry.Key]map[string]int{}, heard: map[string]time.Time{}}
			ims = append(ims, m)
			go func() {
				_ = members[c].Watch(ctx, registry.SinkFuncs{OnSet: m.set, OnSynced: m.markSynced})
			}()
			continue
		}
		go members[c].Heartbeat(ctx)
		n := &atomic.Int64{}
		watched = append(watched, n)
		for _, path := range []string{"/apis/hub.clustermap.io/v1alpha1/namespaces/" + ns + "/clusterexports", "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases"} {
			go watchBytes(ctx, b, cfg, path, n)
		}
	}
	waitAll(b, "the importers' first sync", time.Minute, func() bool { return synced(ims) })

	// Every member but the last publishes everything; then the last one's
	// bulk export is timed to its last import in both importers.
	start := time.Now()
	var wg sync.WaitGroup
	for c := range s.clusters - 1 {
		wg.Go(func() { publishEvery(ctx, b, s, c, members[c].Publish, 4) })
	}
	wg.Wait()
	waitHeardBy(b, s, ims, 0, s.clusters-1, 30*time.Minute)
	fmt.Printf("hub fleet: %d members published %d services each; imported by %d members in %v\n", s.clusters-1, s.services, importers, time.Since(start).Round(time.Second))
	last := s.clusters - 1
	start = time.Now()
	publishEvery(ctx, b, s, last, members[last].Publish, 4)
	written := time.Since(start)
	bulk := waitHeardBy(b, s, ims, last, last+1, 15*time.Minute).Sub(start)
	fmt.Printf("hub fleet: cluster-%02d's bulk export of %d services written in %v, imported by both importers in %v\n", last, s.services, written.Round(100*time.Millisecond), bulk.Round(100*time.Millisecond))

	// Pod changes: one more endpoint in a service of a member that does
	// not import, timed from its publish to both importers hearing it.
	var took []time.Duration
	extra := map[[2]int]int{}
	pick := rand.New(rand.NewPCG(1, 2)) // the same changes each run
	for range changes {
		c, i := importers+pick.IntN(s.clusters-importers), pick.IntN(s.services)
		extra[[2]int{c, i}]++
		e := s.export(c, i, extra[[2]int{c, i}])
		began := time.Now()
		harness.Must(b, publishRetrying(ctx, members[c].Publish, e))
		var heard time.Time
		waitAll(b, "a pod change in both importers", time.Minute, func() bool {
			heard = time.Time{}
			for _, m := range ims {
				at, ok := m.has(e.Key, e.Cluster, len(e.Endpoints))
				if !ok {
					return false
				}
				heard = later(heard, at)
			}
			return true
		})
		took = append(took, heard.Sub(began))
		time.Sleep(200 * time.Millisecond)
	}
	p50, p99 := percentile(took, 50), percentile(took, 99)
	fmt.Printf("hub fleet: %d pod changes, publish to both importers: p50 %v, p99 %v\n", len(took), p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	target, why := 2*time.Second, "the issue's target at more than 2 clusters"
	if s.clusters <= 2 {
		target, why = time.Second, "the issue's target at 2 clusters"
	}
	within(b, "hub pod change p99", p99, target, why)

	// Idle: nothing published; Leases renewed.
	reqs0, bytes0 := calls.Load(), sum(watched)
	time.Sleep(window)
	reqs, bytes := float64(calls.Load()-reqs0), sum(watched)-bytes0
	fmt.Printf("hub fleet idle over %v: the %d members made %.2f requests/s to the hub (watches aside); each watching member's watches carried %.0f bytes/s\n",
		window, s.clusters, reqs/window.Seconds(), float64(bytes)/window.Seconds()/float64(max(1, len(watched))))
	fmt.Printf("hub fleet: each watching member's watches carried %.0f MiB in all\n", float64(sum(watched))/float64(max(1, len(watched)))/(1<<20))
	objects, dbBytes := hubStorage(ctx, b, admin, ns)
	fmt.Printf("hub fleet: %d ClusterExports on the hub, etcd's database %.0f MiB\n", objects, dbBytes/(1<<20))
	b.ReportMetric(bulk.Seconds(), "bulk-s")
	b.ReportMetric(float64(p50.Milliseconds()), "podchange-p50-ms")
	b.ReportMetric(float64(p99.Milliseconds()), "podchange-p99-ms")
	b.ReportMetric(reqs/window.Seconds(), "idle-req/s")
}

// waitHeardBy waits until every importer heard every service of the
// members from up to (not including) to, as first published; it returns
// when the last was heard.
func waitHeardBy(b testing.TB, s fleetShape, ims []*fleetMember, from, to int, within time.Duration) time.Time {
	var last time.Time
	waitAll(b, fmt.Sprintf("cluster-%02d to cluster-%02d's exports in the importers", from, to-1), within, func() bool {
		last = time.Time{}
		for c := from; c < to; c++ {
			for i := range s.services {
				e := s.export(c, i, 0)
				for k, m := range ims {
					if k == c {
						continue // an importer's own (importers are the first members)
					}
					at, ok := m.has(e.Key, e.Cluster, len(e.Endpoints))
					if !ok {
						return false
					}
					last = later(last, at)
				}
			}
		}
		return true
	})
	return last
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// watchBytes holds a watch of path open as the member cfg reaches it,
// counting what it carries into n, until ctx ends. When the hub ends it
// (a watcher too slow for a burst is closed), it goes on from the last
// resourceVersion read, as a reflector does: a new watch without one
// would send every object again.
func watchBytes(ctx context.Context, b testing.TB, cfg *rest.Config, path string, n *atomic.Int64) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Error(err)
		return
	}
	rv := ""
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+path+"?watch=true&allowWatchBookmarks=true&resourceVersion="+rv, nil)
		if err != nil {
			b.Error(err)
			return
		}
		resp, err := hc.Do(req)
		if err == nil {
			if resp.StatusCode != http.StatusOK {
				b.Errorf("watch %s: %s", path, resp.Status)
			}
			dec := json.NewDecoder(io.TeeReader(resp.Body, counting{n}))
			for {
				var ev struct {
					Type   string `json:"type"`
					Object struct {
						Metadata struct {
							ResourceVersion string `json:"resourceVersion"`
						} `json:"metadata"`
					} `json:"object"`
				}
				if dec.Decode(&ev) != nil {
					break
				}
				switch {
				case ev.Type == "ERROR":
					rv = "" // too old: every object again
				case ev.Object.Metadata.ResourceVersion != "":
					rv = ev.Object.Metadata.ResourceVersion
				}
			}
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func sum(ns []*atomic.Int64) (total int64) {
	for _, n := range ns {
		total += n.Load()
	}
	return total
}

// hubMetrics reads the hub API server's metrics.
func hubMetrics(b testing.TB, admin *rest.Config) map[string]*dto.MetricFamily {
	b.Helper()
	hc, err := rest.HTTPClientFor(admin)
	harness.Must(b, err)
	resp, err := hc.Get(admin.Host + "/metrics")
	harness.Must(b, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	harness.Must(b, err)
	return families
}

// hubStorage is how many ClusterExports the hub holds in ns, and the size
// of its etcd's database.
func hubStorage(ctx context.Context, b testing.TB, admin *rest.Config, ns string) (objects int, size float64) {
	c := harness.ClientWith(b, admin, hub.Scheme())
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(hubv1alpha1.GroupVersion.WithKind("ClusterExportList"))
	harness.Must(b, c.List(ctx, list, client.InNamespace(ns)))
	for _, m := range hubMetrics(b, admin)["apiserver_storage_size_bytes"].GetMetric() {
		size = max(size, m.GetGauge().GetValue())
	}
	return len(list.Items), size
}

// countCalls counts the requests it carries, watches aside.
type countCalls struct {
	http.RoundTripper
	n *atomic.Int64
}

func (c countCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Get("watch") != "true" {
		c.n.Add(1)
	}
	return c.RoundTripper.RoundTrip(r)
}

// counting adds what is written to it to n.
type counting struct{ n *atomic.Int64 }

func (c counting) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}
