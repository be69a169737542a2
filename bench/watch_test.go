//go:build e2e

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkWatcherStorm: one cluster's change feed, at the shipped call
// budgets, with 1,000 services of its clusterset and 1,000 of another in
// other HTTP namespaces. Over 10 minutes: sweeps (the sweep period is
// set to 4 minutes so that sweeps fall inside the window; shipped: 6 h)
// and a 60 s outage from minute 6. Prints the calls of every minute: each event
// must cost one bounded catch-up, and the idle figure must return within 2
// minutes (a gap past the 10 s overlap must not re-read every service:
// at 20 calls/s that takes longer than the overlap again).
func BenchmarkWatcherStorm(b *testing.B) {
	const ours, foreign, window = 1000, 1000, 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(b, cloudmaplocal.Options{MaxInstancesPerNamespace: 100000})
	setup := srv.Client(b, cloudmapclient.Options{})
	populate := func(nsPrefix, set string, n, perNS int) {
		for i := 0; i < n; i++ {
			if i%perNS == 0 {
				cloudmaptest.Namespace(b, setup, fmt.Sprintf("%s-%d", nsPrefix, i/perNS))
			}
		}
		nss, _ := setup.ListNamespaces(ctx, &sd.ListNamespacesInput{})
		ids := map[string]string{}
		for _, ns := range nss.Namespaces {
			ids[aws.ToString(ns.Name)] = aws.ToString(ns.Id)
		}
		for i := 0; i < n; i++ {
			s, err := setup.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(fmt.Sprintf("svc-%d", i)), NamespaceId: aws.String(ids[fmt.Sprintf("%s-%d", nsPrefix, i/perNS)])})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := setup.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: s.Service.Id, InstanceId: aws.String("i-1"),
				Attributes: map[string]string{recordfmt.AttrIPv4: "10.0.0.1", recordfmt.AttrPort: "80", recordfmt.AttrClusterID: "c1", recordfmt.AttrClusterSetID: set}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	populate("ours", "set", ours, 100)
	populate("theirs", "another-set", foreign, 100)

	calls := &cloudmapclient.Calls{}
	co := srv.Shipped()
	co.OnCall = calls.Record
	c := srv.Client(b, co)
	synced := make(chan struct{})
	var heard sync.Map
	reg := cloudmap.New(c, cloudmap.Options{ClusterSet: "set", Cluster: "c2", Controller: "bench", Log: logr.Discard(), Watch: cloudmap.WatchOptions{SweepInterval: 4 * time.Minute}})
	go func() {
		_ = reg.Watch(ctx, registry.SinkFuncs{OnSet: func(k registry.Key, e []registry.Export) { heard.Store(k, len(e)) }, OnSynced: func() { close(synced) }})
	}()
	<-synced
	time.Sleep(30 * time.Second) // the first reads settle

	b.ResetTimer()
	perMinute := make([]float64, window)
	total := func() float64 { t, _ := callsBetween(nil, calls.Snapshot()); return t }
	last := total()
	for m := 0; m < window; m++ {
		if m == 6 {
			srv.SetFaults(cloudmaplocal.Faults{Outage: true})
			time.AfterFunc(time.Minute, func() { srv.SetFaults(cloudmaplocal.Faults{}) })
		}
		time.Sleep(time.Minute)
		now := total()
		perMinute[m], last = now-last, now
	}
	b.StopTimer()
	imported := 0
	heard.Range(func(_, v any) bool {
		if v.(int) > 0 {
			imported++
		}
		return true
	})
	fmt.Printf("change feed at the shipped budgets, %d services of this clusterset (%d heard) + %d of another, a sweep every 4 minutes, 60 s outage from minute 6:\n", ours, imported, foreign)
	for m, n := range perMinute {
		fmt.Printf("  minute %2d: %5.0f calls\n", m+1, n)
	}
	idle := (perMinute[0] + perMinute[1] + perMinute[2]) / 3
	fmt.Printf("  idle %.0f calls/min; minutes 9-10 after the outage: %.0f, %.0f\n", idle, perMinute[8], perMinute[9])
	if perMinute[9] > 1.5*idle {
		b.Errorf("calls did not return to the idle figure within 2 minutes of the outage: %.0f vs %.0f", perMinute[9], idle)
	}
	if imported != ours {
		b.Errorf("%d of %d services heard", imported, ours)
	}
}

// writeCounter counts the watch events of clustermap's objects in a
// cluster: every write to them shows as one.
type writeCounter struct {
	mu sync.Mutex
	n  map[string]int
	on bool
}

func (w *writeCounter) count(kind string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on {
		w.n[kind]++
	}
}

func countWrites(ctx context.Context, b *testing.B, c *devenv.Cluster) *writeCounter {
	wc := &writeCounter{n: map[string]int{}}
	ca, err := cache.New(c.Config, cache.Options{Scheme: kube.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	for kind, obj := range map[string]client.Object{
		"ServiceImport": &mcsv1beta1.ServiceImport{}, "ServiceExport": &mcsv1beta1.ServiceExport{},
		"EndpointSlice": &discoveryv1.EndpointSlice{}, "Service": &corev1.Service{},
		"Lease": &coordinationv1.Lease{}, // the status Lease: a heartbeat a minute
	} {
		inf, err := ca.GetInformer(ctx, obj)
		if err != nil {
			b.Fatal(err)
		}
		ours := func(o any) bool {
			m, ok := o.(metav1.Object)
			if !ok {
				return false
			}
			l := m.GetLabels()
			return kind == "ServiceExport" || kind == "ServiceImport" || l[imports.LabelManagedBy] == "clustermap" || l[discoveryv1.LabelManagedBy] == imports.ManagedBy ||
				(kind == "Lease" && m.GetName() == statuslease.LeaseName)
		}
		_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { ours(o) },
			UpdateFunc: func(_, o any) {
				if ours(o) {
					wc.count(kind)
				}
			},
			DeleteFunc: func(o any) {
				if ours(o) {
					wc.count(kind)
				}
			},
		})
	}
	go func() { _ = ca.Start(ctx) }()
	ca.WaitForCacheSync(ctx)
	return wc
}

func (w *writeCounter) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n, w.on = map[string]int{}, true
}

func (w *writeCounter) stop() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.on = false
	return w.n
}

// BenchmarkIdle: a steady clusterset at the shipped defaults, with 10, 500
// and 2,000 services exported by cluster-1 and imported by cluster-2; in
// one account, then across two (cluster-1 in the member account).
// For each size, 2 minutes after convergence, it counts over a window
// (10 minutes; CLUSTERMAP_BENCH_WINDOW shortens it for a quick look) each
// cluster's Cloud Map calls per minute (target <= 60 whatever the size),
// Cloud Map writes (target 0) and writes to clustermap's Kubernetes
// objects in both clusters (target 0, but for the status Lease's heartbeat,
// one a minute).
func BenchmarkIdle(b *testing.B) {
	windowLen := 10 * time.Minute
	if v := os.Getenv("CLUSTERMAP_BENCH_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		windowLen = d
	}
	for _, p := range pairs {
		b.Run(p.name, func(b *testing.B) { idle(b, p, windowLen) })
	}
}

// idle is BenchmarkIdle for one pair: in one account, or across two
// (cluster-1 exporting from the member account).
func idle(b *testing.B, p pairSetup, windowLen time.Duration) {
	const sizes, perNS = 2000, 100
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := harness.Clusters(b, 2)
	cm := harness.CloudMap(b, p.emulator(cloudmaplocal.Options{MaxInstancesPerNamespace: 100000}))
	var nsNames []string
	for n := range sizes / perNS {
		nsNames = append(nsNames, fmt.Sprintf("idle-%d", n))
	}
	p.share(ctx, b, cm, nsNames...)
	counts, _, wait := startCountedLogged(ctx, env, cm.URL, p.tune(env.Clusters[0].ID))
	defer func() { cancel(); _ = wait() }()
	src := harness.Client(b, env.Clusters[0].Config)
	dst := harness.Client(b, env.Clusters[1].Config)
	imported := track(ctx, b, env.Clusters[1], imports.ManagedBy, mcsv1beta1.LabelServiceName)
	writes := []*writeCounter{countWrites(ctx, b, env.Clusters[0]), countWrites(ctx, b, env.Clusters[1])}
	have := 0
	b.ResetTimer()
	type result struct {
		size     int
		converge time.Duration
		// namespaces holds the services (the change records' own
		// besides).
		namespaces int
		perMin     [2]float64
		control    [2]float64
		data       [2]float64
		byOp       [2]string
		cmWrites   float64
		k8sWrites  [2]map[string]int
	}
	var results []result
	for _, size := range []int{10, 500, 2000} {
		start := time.Now()
		for ; have < size; have++ {
			ns, name := fmt.Sprintf("idle-%d", have/perNS), fmt.Sprintf("svc-%d", have%perNS)
			if have%perNS == 0 {
				for _, cl := range []client.Client{src, dst} {
					if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
						b.Fatal(err)
					}
				}
			}
			createApp(ctx, b, src, ns, name, 1, nil)
			if err := src.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}); err != nil {
				b.Fatal(err)
			}
		}
		for {
			done := 0
			for i := 0; i < size; i++ {
				if len(imported.ips(fmt.Sprintf("idle-%d/svc-%d", i/perNS, i%perNS))) == 1 {
					done++
				}
			}
			if done == size {
				break
			}
			if time.Since(start) > 20*time.Minute {
				b.Fatalf("%d of %d services imported", done, size)
			}
			time.Sleep(time.Second)
		}
		r := result{size: size, converge: time.Since(start), namespaces: (size + perNS - 1) / perNS}
		time.Sleep(2 * time.Minute)
		before := []map[string]float64{counts.snapshot(env.Clusters[0].ID), counts.snapshot(env.Clusters[1].ID)}
		cmBefore := emulatorCalls(b, cm.AdminURL)
		for _, w := range writes {
			w.start()
		}
		time.Sleep(windowLen)
		for i, w := range writes {
			r.k8sWrites[i] = w.stop()
		}
		cmAfter := emulatorCalls(b, cm.AdminURL)
		for i, c := range env.Clusters {
			t, byOp := callsBetween(before[i], counts.snapshot(c.ID))
			r.perMin[i], r.byOp[i] = t/windowLen.Minutes(), byOp
			calls := diffMap(before[i], counts.snapshot(c.ID))
			control, data := controlPlane(calls)
			r.control[i], r.data[i] = control/windowLen.Minutes(), data/windowLen.Minutes()
		}
		for op, v := range cmAfter {
			switch op {
			case "RegisterInstance", "DeregisterInstance", "CreateService", "UpdateService", "DeleteService", "CreateHttpNamespace",
				"DeleteNamespace", "TagResource", "UntagResource", "UpdateInstanceCustomHealthStatus":
				r.cmWrites += v - cmBefore[op]
			}
		}
		results = append(results, r)
	}
	b.StopTimer()
	fmt.Printf("idle clusterset (%s) at the shipped defaults, cluster-1 exporting, cluster-2 importing, window %v starting 2 minutes after convergence:\n", p.name, windowLen)
	for _, r := range results {
		fmt.Printf("  %4d services (converged in %v): Cloud Map calls/min cluster-1 %.1f (control %.1f, data %.1f), cluster-2 %.1f (control %.1f, data %.1f); Cloud Map writes %.0f; Kubernetes writes cluster-1 %v, cluster-2 %v\n",
			r.size, r.converge.Round(time.Second), r.perMin[0], r.control[0], r.data[0], r.perMin[1], r.control[1], r.data[1], r.cmWrites, r.k8sWrites[0], r.k8sWrites[1])
		m := shipped()
		bound, why := m.idleControl(r.namespaces)
		atMost(b, "  ... control-plane calls/min, busier cluster", max(r.control[0], r.control[1]), bound, why)
		fmt.Printf("       cluster-1 [%s]\n       cluster-2 [%s]\n", r.byOp[0], r.byOp[1])
		b.ReportMetric(max(r.perMin[0], r.perMin[1]), fmt.Sprintf("calls/min@%d", r.size))
	}
}

// BenchmarkEmulatorOperations: 1 million asynchronous operations
// (RegisterInstance of 100 instances over and over) through the real SDK
// against `cloudmap-local --data-dir`: resident memory and the
// snapshot's size must stay flat, since finished operations are pruned
// past 10,000.
func BenchmarkEmulatorOperations(b *testing.B) {
	dir := b.TempDir()
	url, pid := startEmulator(b, "--data-dir", dir)
	ctx := context.Background()
	c := cloudmaptest.ClientOf(b, url, cloudmapclient.Options{})
	svc, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("svc"), NamespaceId: aws.String(cloudmaptest.Namespace(b, c, "ops"))})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	fmt.Printf("cloudmap-local --data-dir, RegisterInstance operations through the SDK, %d cores:\n", runtimeCores())
	done := 0
	for _, upTo := range []int{100_000, 250_000, 500_000, 1_000_000} {
		rate, _, _, err := load(upTo-done, 8, func(i int) error {
			_, err := c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: svc.Service.Id, InstanceId: aws.String(fmt.Sprint("i-", (done+i)%100)),
				Attributes: map[string]string{recordfmt.AttrIPv4: fmt.Sprintf("10.0.0.%d", (done+i)%100)}})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		done = upTo
		time.Sleep(300 * time.Millisecond) // a snapshot is written every 100 ms
		rss, peak := rssMB(pid)
		st, err := os.Stat(filepath.Join(dir, "cloudmap-state.json"))
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("  after %7d operations (%.0f/s): %.1f MB resident (%.1f MB peak), snapshot %.2f MB\n", done, rate, rss, peak, float64(st.Size())/1e6)
	}
}
