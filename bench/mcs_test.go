//go:build e2e

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/test/harness"
)

// importTracker follows one importing cluster's EndpointSlices: the ready
// addresses of every imported service.
type importTracker struct {
	mu     sync.Mutex
	slices map[string]map[string]bool // slice ns/name -> ready IPs
	owner  map[string]string          // slice ns/name -> service ns/name
}

func (tr *importTracker) update(s *discoveryv1.EndpointSlice, serviceLabel string, gone bool) {
	key := s.Namespace + "/" + s.Name
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if gone {
		delete(tr.slices, key)
		return
	}
	ips := map[string]bool{}
	for _, e := range s.Endpoints {
		if e.Conditions.Ready == nil || *e.Conditions.Ready {
			for _, a := range e.Addresses {
				ips[a] = true
			}
		}
	}
	tr.slices[key] = ips
	tr.owner[key] = s.Namespace + "/" + s.Labels[serviceLabel]
}

// ips returns a service's imported ready addresses.
func (tr *importTracker) ips(svc string) map[string]bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[string]bool{}
	for k, s := range tr.slices {
		if tr.owner[k] == svc {
			for ip := range s {
				out[ip] = true
			}
		}
	}
	return out
}

// track follows the EndpointSlices managed by manager, grouped by the
// service the label names.
func track(ctx context.Context, b *testing.B, c *devenv.Cluster, manager, serviceLabel string) *importTracker {
	tr := &importTracker{slices: map[string]map[string]bool{}, owner: map[string]string{}}
	ca, err := cache.New(c.Config, cache.Options{Scheme: kube.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	inf, err := ca.GetInformer(ctx, &discoveryv1.EndpointSlice{})
	if err != nil {
		b.Fatal(err)
	}
	ours := func(o any) (*discoveryv1.EndpointSlice, bool) {
		s, ok := o.(*discoveryv1.EndpointSlice)
		return s, ok && s.Labels[discoveryv1.LabelManagedBy] == manager
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if s, ok := ours(o); ok {
				tr.update(s, serviceLabel, false)
			}
		},
		UpdateFunc: func(_, o any) {
			if s, ok := ours(o); ok {
				tr.update(s, serviceLabel, false)
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := ours(o); ok {
				tr.update(s, serviceLabel, true)
			}
		},
	})
	go func() { _ = ca.Start(ctx) }()
	ca.WaitForCacheSync(ctx)
	return tr
}

func percentile(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

// emulatorCalls reads the emulator's call counters by operation.
func emulatorCalls(b *testing.B, admin string) map[string]float64 {
	return harness.EmulatorCalls(b, admin)
}

// perCluster counts each in-process controller's Cloud Map calls by
// operation.
type perCluster struct {
	mu sync.Mutex
	n  map[string]*cloudmapclient.Calls
}

func (p *perCluster) hook(id string) func(string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &cloudmapclient.Calls{}
	p.n[id] = c
	return c.Record
}

func (p *perCluster) snapshot(id string) map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id].Snapshot()
}

// startCounted runs the controllers at the shipped defaults, counting
// each cluster's Cloud Map calls.
func startCounted(ctx context.Context, env *devenv.Env, url string) (*perCluster, func() error) {
	counts, _, wait := startCountedLogged(ctx, env, url, nil)
	return counts, wait
}

// startCountedLogged is startCounted that also counts each cluster's error
// log lines.
func startCountedLogged(ctx context.Context, env *devenv.Env, url string, tune func(cluster string, o *controller.Options)) (*perCluster, map[string]*errorLog, func() error) {
	counts := &perCluster{n: map[string]*cloudmapclient.Calls{}}
	byConfig := map[string]string{}
	errs := map[string]*errorLog{}
	for _, c := range env.Clusters {
		byConfig[c.Server] = c.ID
		errs[c.ID] = &errorLog{}
	}
	wait := env.StartControllers(ctx, url, func(c *devenv.Cluster) logr.Logger { return errs[c.ID].logger() },
		func(o *controller.Options) {
			o.OnCloudMapCall = counts.hook(byConfig[o.Config.Host])
			if tune != nil {
				tune(byConfig[o.Config.Host], o)
			}
		})
	return counts, errs, wait
}

// BenchmarkMCS: one exporting and two importing clusters at the shipped
// defaults (20 control-plane calls/s, 200 Discover* calls/s, 1.5 s poll).
// 500 services of 10 endpoints are exported at once: registration is
// bounded by the exporter's budget (5,500 records at 20/s is at least
// 275 s); the benchmark prints how long after each service's records were
// registered (its ServiceExport Ready) both importing clusters hold its 10
// endpoints (target p99 <= 10 s), the calls each cluster made by
// operation, and the calls per exported endpoint change. Then 50 single pod
// changes, timed and counted the same way.
func BenchmarkMCS(b *testing.B) {
	const namespaces, perNamespace, replicas = 5, 100, 10
	const services = namespaces * perNamespace
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 5,050 pods need 6 nodes of 1,022 addresses.
	env := harness.ClustersWith(b, devenv.Options{Clusters: 3, Nodes: 6})
	cm := harness.CloudMap(b, cloudmaplocal.Options{})
	counts, errs, wait := startCountedLogged(ctx, env, cm.URL, nil)
	defer func() { cancel(); _ = wait() }()

	clients := make([]client.Client, 3)
	for i, c := range env.Clusters {
		clients[i] = harness.Client(b, c.Config)
	}
	src := clients[0]
	type svcKey struct{ ns, name string }
	var keys []svcKey
	for n := 0; n < namespaces; n++ {
		ns := fmt.Sprintf("bench-%d", n)
		for _, cl := range clients {
			if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				b.Fatal(err)
			}
		}
		for s := 0; s < perNamespace; s++ {
			name := fmt.Sprintf("svc-%d", s)
			keys = append(keys, svcKey{ns, name})
			createApp(ctx, b, src, ns, name, replicas, nil)
		}
	}
	// All pods ready before the clock starts: the benchmark times clustermap, not kwok.
	waitReadyEndpoints(ctx, b, src, services*replicas)
	source := track(ctx, b, env.Clusters[0], "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName)
	trackers := []*importTracker{
		track(ctx, b, env.Clusters[1], imports.ManagedBy, mcsv1beta1.LabelServiceName),
		track(ctx, b, env.Clusters[2], imports.ManagedBy, mcsv1beta1.LabelServiceName),
	}
	ids := []string{env.Clusters[0].ID, env.Clusters[1].ID, env.Clusters[2].ID}
	snap := func() []map[string]float64 {
		var out []map[string]float64
		for _, id := range ids {
			out = append(out, counts.snapshot(id))
		}
		return out
	}

	b.ResetTimer()
	before := snap()
	start := time.Now()
	for _, k := range keys {
		if err := src.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.ns}}); err != nil {
			b.Fatal(err)
		}
	}
	registered := make([]time.Time, len(keys))
	imported := make([]time.Time, len(keys))
	deadline := time.Now().Add(20 * time.Minute)
	for remaining := len(keys); remaining > 0; {
		if time.Now().After(deadline) {
			b.Fatalf("%d services not imported everywhere", remaining)
		}
		exports := &mcsv1beta1.ServiceExportList{}
		if err := src.List(ctx, exports); err != nil {
			b.Fatal(err)
		}
		ready := map[svcKey]bool{}
		for _, se := range exports.Items {
			for _, c := range se.Status.Conditions {
				if c.Type == string(mcsv1beta1.ServiceExportConditionReady) && c.Status == metav1.ConditionTrue {
					ready[svcKey{se.Namespace, se.Name}] = true
				}
			}
		}
		now := time.Now()
		for i, k := range keys {
			if registered[i].IsZero() && ready[k] {
				registered[i] = now
			}
			if imported[i].IsZero() && len(trackers[0].ips(k.ns+"/"+k.name)) == replicas && len(trackers[1].ips(k.ns+"/"+k.name)) == replicas {
				imported[i] = now
				remaining--
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	bulkCalls := diffCalls(before, snap())
	var lag []time.Duration
	var lastRegistered, lastImported time.Time
	for i := range keys {
		if registered[i].IsZero() || registered[i].After(imported[i]) {
			registered[i] = imported[i] // Ready seen after the import: no lag measurable
		}
		lag = append(lag, imported[i].Sub(registered[i]))
		lastRegistered = maxTime(lastRegistered, registered[i])
		lastImported = maxTime(lastImported, imported[i])
	}

	// Pod changes: one more pod for 50 services, one at a time, at random
	// gaps. Timed from the source cluster's EndpointSlice listing the new
	// address to both importing clusters listing it.
	before = snap()
	var podLat []time.Duration
	for i := 0; i < 50; i++ {
		k := keys[i*(len(keys)/50)]
		svc := k.ns + "/" + k.name
		ip, seen := addPod(ctx, b, src, source, k.ns, k.name)
		for !trackers[0].ips(svc)[ip] || !trackers[1].ips(svc)[ip] {
			if time.Since(seen) > time.Minute {
				b.Fatalf("%s of %s not imported a minute after it appeared", ip, svc)
			}
			time.Sleep(2 * time.Millisecond)
		}
		podLat = append(podLat, time.Since(seen))
		time.Sleep(time.Duration(rand.Float64() * float64(2*time.Second)))
	}
	podCalls := diffCalls(before, snap())
	b.StopTimer()

	fmt.Printf("MCS over Cloud Map (emulator) at the shipped defaults, 1 exporting + 2 importing clusters, %d services x %d endpoints exported at once, %d cores:\n", services, replicas, runtimeCores())
	fmt.Printf("  first ServiceExport -> last service registered (exporter budget bound): %v\n", lastRegistered.Sub(start).Round(time.Second))
	fmt.Printf("  first ServiceExport -> every import complete in both clusters: %v\n", lastImported.Sub(start).Round(time.Second))
	m := shipped()
	fmt.Printf("  service registered (Ready) -> complete in both importing clusters: p50 %v  max %v; last registered -> last imported %v\n",
		percentile(lag, 50).Round(time.Millisecond), percentile(lag, 100).Round(time.Millisecond), lastImported.Sub(lastRegistered).Round(time.Millisecond))
	within(b, "  ... p99", percentile(lag, 99), m.changeBound(), m.changeWhy())
	total := 0.0
	for i, id := range ids {
		t, byOp := callsBetween(nil, bulkCalls[i])
		total += t
		fmt.Printf("  bulk, %s calls: %.0f [%s]\n", id, t, byOp)
	}
	fmt.Printf("  bulk: %.2f Cloud Map calls per exported endpoint (all 3 clusters, %d endpoints)\n", total/float64(services*replicas), services*replicas)
	fmt.Printf("  new pod in the source EndpointSlice -> in both importing clusters (50 changes): p50 %v\n", percentile(podLat, 50).Round(time.Millisecond))
	within(b, "  ... p99", percentile(podLat, 99), m.changeBound(), m.changeWhy())
	total = 0
	for i, id := range ids {
		t, byOp := callsBetween(nil, podCalls[i])
		total += t
		fmt.Printf("  50 pod changes, %s calls: %.0f [%s]\n", id, t, byOp)
	}
	fmt.Printf("  pod changes: %.1f Cloud Map calls per endpoint change (all 3 clusters, idle polling included)\n", total/50)
	for _, id := range ids {
		fmt.Printf("  %s error log lines, whole run: %s\n", id, errs[id])
	}
	b.ReportMetric(float64(percentile(lag, 99).Milliseconds()), "registered-to-imported-p99-ms")
	b.ReportMetric(float64(percentile(podLat, 99).Milliseconds()), "podchange-p99-ms")
}

func diffCalls(before, after []map[string]float64) []map[string]float64 {
	out := make([]map[string]float64, len(after))
	for i := range after {
		out[i] = map[string]float64{}
		for op, v := range after[i] {
			if d := v - before[i][op]; d > 0 {
				out[i][op] = d
			}
		}
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitReadyEndpoints waits until the cluster's own EndpointSlices list n
// ready endpoints.
func waitReadyEndpoints(ctx context.Context, b *testing.B, cl client.Client, n int) {
	setup := time.Now()
	for {
		slices := &discoveryv1.EndpointSliceList{}
		if err := cl.List(ctx, slices, client.MatchingLabels{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}); err != nil {
			b.Fatal(err)
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		if ready >= n {
			b.Logf("%d endpoints ready in %v", n, time.Since(setup).Round(time.Second))
			return
		}
		if time.Since(setup) > 10*time.Minute {
			b.Fatalf("only %d of %d endpoints ready", ready, n)
		}
		time.Sleep(time.Second)
	}
}
