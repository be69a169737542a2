package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
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

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
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
	ca, err := cache.New(c.Config, cache.Options{Scheme: controller.Scheme()})
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
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	calls := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "cloudmaplocal_requests_total{") {
			continue
		}
		var v float64
		op := l[strings.Index(l, `operation="`)+len(`operation="`):]
		op = op[:strings.IndexByte(op, '"')]
		fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v)
		calls[op] += v
	}
	return calls
}

// BenchmarkMCS: one exporting and two importing clusters, 500 services of
// 10 endpoints. Prints export-to-import latency, pod-change-to-import
// latency and idle Cloud Map calls. Targets (issue 3): p99 under 2 s for
// both, idle calls per minute per cluster at most services/10 = 50.
func BenchmarkMCS(b *testing.B) {
	const namespaces, perNamespace, replicas = 5, 100, 10
	const services = namespaces * perNamespace
	exportRate := 5.0 // ServiceExports created per second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := devenv.ForTest(b, 3)
	cm := devenv.CloudMapForTest(b, cloudmaplocal.Options{})
	wait := env.StartControllers(ctx, cm.URL, func(*devenv.Cluster) logr.Logger { return logr.Discard() },
		func(o *controller.Options) { o.CloudMapQPS, o.CloudMapBurst = 200, 400 })
	defer func() { cancel(); _ = wait() }()

	clients := make([]client.Client, 3)
	for i, c := range env.Clusters {
		var err error
		if clients[i], err = client.New(c.Config, client.Options{Scheme: controller.Scheme()}); err != nil {
			b.Fatal(err)
		}
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
	setup := time.Now()
	for {
		slices := &discoveryv1.EndpointSliceList{}
		if err := src.List(ctx, slices, client.MatchingLabels{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}); err != nil {
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
		if ready == services*replicas {
			break
		}
		if time.Since(setup) > 10*time.Minute {
			b.Fatalf("only %d of %d pods ready", ready, services*replicas)
		}
		time.Sleep(time.Second)
	}
	b.Logf("%d pods ready in %v", services*replicas, time.Since(setup).Round(time.Second))
	source := track(ctx, b, env.Clusters[0], "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName)
	trackers := []*importTracker{
		track(ctx, b, env.Clusters[1], imports.ManagedBy, mcsv1beta1.LabelServiceName),
		track(ctx, b, env.Clusters[2], imports.ManagedBy, mcsv1beta1.LabelServiceName),
	}

	b.ResetTimer()
	// Export, paced; time until both importing clusters hold all 10 endpoints.
	created := make([]time.Time, len(keys))
	done := make([]time.Time, len(keys))
	// Random gaps (mean 1/exportRate): changes in step with the importers'
	// poll would all wait a full poll period.
	go func() {
		for i, k := range keys {
			time.Sleep(time.Duration(rand.Float64() * 2 * float64(time.Second) / exportRate))
			created[i] = time.Now()
			if err := src.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.ns}}); err != nil {
				b.Error(err)
			}
		}
	}()
	deadline := time.Now().Add(time.Duration(float64(len(keys))/exportRate)*time.Second + 2*time.Minute)
	for remaining := len(keys); remaining > 0; {
		if time.Now().After(deadline) {
			b.Fatalf("%d services not imported everywhere", remaining)
		}
		for i, k := range keys {
			if !done[i].IsZero() || created[i].IsZero() {
				continue
			}
			if len(trackers[0].ips(k.ns+"/"+k.name)) == replicas && len(trackers[1].ips(k.ns+"/"+k.name)) == replicas {
				done[i] = time.Now()
				remaining--
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	var exportLat []time.Duration
	for i := range keys {
		exportLat = append(exportLat, done[i].Sub(created[i]))
	}

	// Pod changes: one more pod for 50 services, one at a time, at random
	// gaps (see above). (kwok reuses
	// a deleted pod's address for its replacement, so deletions show no
	// change.) Timed from the source cluster's EndpointSlice listing the new
	// address, and from the scale request, to both importing clusters
	// listing it.
	var podLat, scaleLat []time.Duration
	for i := 0; i < 50; i++ {
		k := keys[i*(len(keys)/50)]
		svc := k.ns + "/" + k.name
		requested := time.Now()
		ip, seen := addPod(ctx, b, src, source, k.ns, k.name)
		for !trackers[0].ips(svc)[ip] || !trackers[1].ips(svc)[ip] {
			if time.Since(seen) > time.Minute {
				b.Fatalf("%s of %s not imported a minute after it appeared", ip, svc)
			}
			time.Sleep(2 * time.Millisecond)
		}
		podLat = append(podLat, time.Since(seen))
		scaleLat = append(scaleLat, time.Since(requested))
		time.Sleep(time.Duration(rand.Float64() * float64(2*time.Second)))
	}

	// Idle: nothing changes for a minute.
	time.Sleep(15 * time.Second) // let replaced pods settle
	before := emulatorCalls(b, cm.AdminURL)
	time.Sleep(time.Minute)
	after := emulatorCalls(b, cm.AdminURL)
	idle, byOp := callsBetween(before, after)
	b.StopTimer()

	fmt.Printf("MCS over Cloud Map (emulator), 1 exporting + 2 importing clusters, %d services x %d endpoints, %d cores:\n", services, replicas, runtimeCores())
	fmt.Printf("  ServiceExport -> complete import in both clusters (exports created at %.0f/s): p50 %v  p99 %v  max %v\n",
		exportRate, percentile(exportLat, 50).Round(time.Millisecond), percentile(exportLat, 99).Round(time.Millisecond), percentile(exportLat, 100).Round(time.Millisecond))
	fmt.Printf("  new pod in the source EndpointSlice -> in both importing clusters (50 changes): p50 %v  p99 %v\n",
		percentile(podLat, 50).Round(time.Millisecond), percentile(podLat, 99).Round(time.Millisecond))
	fmt.Printf("  (from the scale request, kwok's pod start included: p50 %v  p99 %v)\n",
		percentile(scaleLat, 50).Round(time.Millisecond), percentile(scaleLat, 99).Round(time.Millisecond))
	fmt.Printf("  idle Cloud Map calls in one minute, 3 clusters: %.0f (%.1f per cluster; target <= %d) [%s]\n",
		idle, idle/3, services/10, byOp)
	b.ReportMetric(float64(percentile(exportLat, 99).Milliseconds()), "export-p99-ms")
	b.ReportMetric(float64(percentile(podLat, 99).Milliseconds()), "podchange-p99-ms")
	b.ReportMetric(idle/3, "idle-calls/min/cluster")
}
