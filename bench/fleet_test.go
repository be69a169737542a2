//go:build e2e

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// fleetShape is a fleet: clusters that each export every service, spread
// over namespaces, most services small and a few large.
type fleetShape struct {
	clusters, namespaces, services int
	// pods of service i in each cluster; ports per service.
	pods  func(i int) int
	ports int
}

// shape is the shipped envelope: 50 clusters x 1,000 services over 40
// namespaces; a service has 2 to 9 pods, one in a hundred 500, the first
// three 2,000 (dual-stack, so 4,000 addresses); 2 ports each.
// CLUSTERMAP_FLEET=clusters,services scales it down for a quick look.
func shape(b testing.TB) fleetShape {
	s := fleetShape{clusters: 50, namespaces: 40, services: 1000, ports: 2, pods: func(i int) int {
		switch {
		case i < 3:
			return 2000
		case i%100 == 50:
			return 500
		default:
			return 2 + i%8
		}
	}}
	if v := os.Getenv("CLUSTERMAP_FLEET"); v != "" {
		if _, err := fmt.Sscanf(v, "%d,%d", &s.clusters, &s.services); err != nil {
			b.Fatalf("CLUSTERMAP_FLEET=%q: want clusters,services", v)
		}
		s.namespaces = max(1, s.services/25)
	}
	return s
}

// fleetClusterSet is the fleet's clusterset.
const fleetClusterSet = "fleet"

func (s fleetShape) key(i int) registry.Key {
	return registry.Key{Namespace: fmt.Sprintf("team-%02d", i%s.namespaces), Name: fmt.Sprintf("svc-%04d", i)}
}

// export is cluster c's export of service i, with extra more pods.
func (s fleetShape) export(c, i, extra int) registry.Export {
	key := s.key(i)
	e := registry.Export{ClusterSet: fleetClusterSet, Cluster: fmt.Sprintf("cluster-%02d", c), Key: key, Type: mcsv1beta1.ClusterSetIP,
		Created: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}
	for p := range s.ports {
		e.Ports = append(e.Ports, mcsv1beta1.ServicePort{Name: "p" + strconv.Itoa(p), Protocol: corev1.ProtocolTCP, Port: int32(80 + p)})
	}
	n := s.pods(i)
	dual := n >= 2000
	if dual {
		e.IPFamilies = append(e.IPFamilies, corev1.IPv6Protocol)
	}
	for pod := range n + extra {
		// Each cluster its pod range (10.<c>.0.0/16), each service its
		// slice of it.
		seq := uint32(i)*4096 + uint32(pod)
		ips := []string{netip.AddrFrom4([4]byte{10, byte(c), byte(seq >> 8), byte(seq)}).String()}
		if dual {
			ips = append(ips, fmt.Sprintf("fd00:%x::%x", c+1, seq+1))
		}
		for _, ip := range ips {
			for _, sp := range e.Ports {
				e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ip, Port: sp.Port + 8000, PortName: sp.Name, Protocol: sp.Protocol,
					Ready: true, Serving: true, NodeName: fmt.Sprintf("node-%d", pod%30), Zone: fmt.Sprintf("use1-az%d", pod%3+1), ServicePort: sp, TargetPort: sp.Name})
			}
		}
	}
	return e
}

// fleetMember is one cluster's registry side, as its controller runs it.
type fleetMember struct {
	*cloudmap.Backend
	// calls are its calls by operation, throttled those Cloud Map refused
	// for the account's quota.
	calls, throttled *cloudmapclient.Calls
	mu               sync.Mutex
	// seen is, per service, each exporting cluster's endpoint count as
	// last heard, and when each (service, cluster, count) was first heard.
	seen   map[registry.Key]map[string]int
	heard  map[string]time.Time
	synced bool
	// published is each export as last published: written again when
	// Cloud Map fails a write it accepted, as the export reconciler does.
	published map[registry.Key]registry.Export
	// publishing serializes the publishes of one key, as the export
	// reconciler's work queue does.
	publishing map[registry.Key]*sync.Mutex
}

// Publish publishes e, one publish of a key at a time, and remembers it.
func (m *fleetMember) Publish(ctx context.Context, e registry.Export) error {
	m.mu.Lock()
	m.published[e.Key] = e
	if m.publishing[e.Key] == nil {
		m.publishing[e.Key] = &sync.Mutex{}
	}
	one := m.publishing[e.Key]
	m.mu.Unlock()
	one.Lock()
	defer one.Unlock()
	return m.Backend.Publish(ctx, e)
}

// writeFailed publishes key's export again, every second until it is
// written (the export reconciler's requeue; OnWriteFailed).
func (m *fleetMember) writeFailed(ctx context.Context, key registry.Key) {
	for ctx.Err() == nil {
		m.mu.Lock()
		e, ok := m.published[key]
		m.mu.Unlock()
		if !ok {
			return
		}
		err := m.Publish(ctx, e)
		if _, limit := err.(*recordfmt.LimitError); err == nil || limit {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (m *fleetMember) set(key registry.Key, exports []registry.Export) {
	counts := make(map[string]int, len(exports))
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range exports {
		counts[e.Cluster] = len(e.Endpoints)
		id := key.String() + "/" + e.Cluster + "/" + strconv.Itoa(len(e.Endpoints))
		if _, ok := m.heard[id]; !ok {
			m.heard[id] = now
		}
	}
	m.seen[key] = counts
}

func (m *fleetMember) markSynced() {
	m.mu.Lock()
	m.synced = true
	m.mu.Unlock()
}

func (m *fleetMember) has(key registry.Key, cluster string, endpoints int) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.heard[key.String()+"/"+cluster+"/"+strconv.Itoa(endpoints)]
	return at, ok
}

// BenchmarkFleet: 50 clusters (each the controller's registry side in this
// process: its own client at the shipped budgets, 20 control-plane and 200
// Discover* calls per second, the 1.5 s poll, packed records) against one
// emulator under the AWS profile (asynchronous operations, lagging reads,
// Cloud Map's quotas and data-plane rate limits), 1,000 services each over
// 40 namespaces (shape). It prints one cluster's bulk export of its 1,000
// services to all 49 others, the idle calls per second per API against the
// account's limits, a pod change's propagation to all 49 others (p50, p99)
// in a burst and after a quiet spell, and the instances used against the
// quotas; each against its target (targets_test.go).
func BenchmarkFleet(b *testing.B) {
	changes, window := fleetRun(b)
	// At 50 x 1,000 every cluster's decode cache would hold all the others'
	// exports: 49 copies in this process, where each controller holds one
	// (its import view's). Past 10 clusters, every read decodes whole.
	s := shape(b)
	r := runFleet(b, shipped(), s, changes, window, s.clusters > 10)
	b.ReportMetric(r.bulk.Seconds(), "bulk-s")
	b.ReportMetric(float64(percentile(r.quiet, 99).Milliseconds()), "podchange-quiet-p99-ms")
}

// fleetRun is how many pod changes a fleet benchmark times
// (CLUSTERMAP_BENCH_CHANGES, 50 by default) and how long it stays idle
// (CLUSTERMAP_BENCH_WINDOW, 1 minute by default).
func fleetRun(b testing.TB) (changes int, window time.Duration) {
	changes, window = 50, time.Minute
	if v := os.Getenv("CLUSTERMAP_BENCH_CHANGES"); v != "" {
		var err error
		if changes, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	if v := os.Getenv("CLUSTERMAP_BENCH_WINDOW"); v != "" {
		var err error
		if window, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
	}
	return changes, window
}

// A reduced fleet, at the shipped settings under the AWS profile, holds
// the targets the full one is held to: 4 clusters x 40 services.
func TestReducedFleet(t *testing.T) {
	s := shape(t)
	s.clusters, s.services, s.namespaces = 4, 40, 4
	runFleet(t, shipped(), s, 6, 0, false)
}

// BenchmarkSensitivity: the reduced fleet's pod change latency against
// how long Cloud Map's operations take and how far its reads trail them
// (neither published by AWS), the watcher at its shipped settings: the
// default profile's operations (0.5-4 s) with a read lag of 0.5, 2 and
// 5 s (the watcher's --cloudmap-read-lag), then its 2 s lag with
// operations of 0.1-0.5, 0.5-4 and 2-8 s. Each run is held to its own
// bound; a summary table is printed last.
func BenchmarkSensitivity(b *testing.B) {
	s := shape(b)
	s.clusters, s.services, s.namespaces = 4, 40, 4
	def := cloudmaplocal.AWS()
	type point struct {
		op  cloudmaplocal.Spread
		lag time.Duration
	}
	var points []point
	for _, lag := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second} {
		points = append(points, point{def.OperationTime, lag})
	}
	for _, op := range []cloudmaplocal.Spread{{Min: 100 * time.Millisecond, Max: 500 * time.Millisecond}, {Min: 2 * time.Second, Max: 8 * time.Second}} {
		points = append(points, point{op, def.ReadLag})
	}
	var rows []string
	for _, pt := range points {
		m := shipped()
		m.profile.OperationTime, m.profile.ReadLag = pt.op, pt.lag
		m.profile.Name = fmt.Sprintf("aws with operations of %v and a read lag of %v", pt.op, pt.lag)
		r := runFleet(b, m, s, 10, 0, false)
		rows = append(rows, fmt.Sprintf("| %v | %v | %v / %v | %v / %v | %v |", pt.op, pt.lag,
			percentile(r.burst, 50).Round(10*time.Millisecond), percentile(r.burst, 99).Round(10*time.Millisecond),
			percentile(r.quiet, 50).Round(10*time.Millisecond), percentile(r.quiet, 99).Round(10*time.Millisecond), m.changeBound()))
	}
	fmt.Printf("Sensitivity, %d clusters x %d services, 10 pod changes in a burst and 10 after a quiet spell each:\n", s.clusters, s.services)
	fmt.Println("| operations | read lag | burst p50 / p99 | quiet p50 / p99 | bound |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	for _, r := range rows {
		fmt.Println(r)
	}
}

// fleetResult is what runFleet measured.
type fleetResult struct {
	bulk         time.Duration
	burst, quiet []time.Duration
}

// runFleet runs fleet s against an emulator of m's profile: every cluster exports everything, the last one's
// bulk export timed to its last import everywhere; the idle calls over
// window (none when 0); changes pod changes in a burst, then as many each
// after a quiet spell (past the fast-poll window), each timed to the last
// of the others hearing it. It prints each result against its target.
// decodeWhole turns the members' decode caches off (Options.DecodeWhole).
func runFleet(b testing.TB, m model, s fleetShape, changes int, window time.Duration, decodeWhole bool) fleetResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(b, cloudmaplocal.Options{Profile: &m.profile})
	var ms []*fleetMember
	for c := range s.clusters {
		m := &fleetMember{calls: &cloudmapclient.Calls{}, throttled: &cloudmapclient.Calls{}, seen: map[registry.Key]map[string]int{}, heard: map[string]time.Time{}, published: map[registry.Key]registry.Export{}, publishing: map[registry.Key]*sync.Mutex{}}
		co := srv.Shipped()
		co.OnCall = func(op string, err error) {
			m.calls.Record(op, err)
			if cloudmapclient.ErrorKind(err) == cloudmapclient.KindThrottled {
				m.throttled.Record(op, err)
			}
		}
		cl := srv.Client(b, co)
		name := fmt.Sprintf("cluster-%02d", c)
		formats := &recordfmt.Formats{Cluster: name}
		m.Backend = cloudmap.New(cl, cloudmap.Options{ClusterSet: fleetClusterSet, Cluster: name, Controller: "clustermap bench", Log: benchLog(name), Formats: formats, Usage: cloudmap.NewUsage(0), DecodeWhole: decodeWhole,
			Observer: registry.ObserverFuncs{OnWriteFailed: func(key registry.Key) { go m.writeFailed(ctx, key) }}})
		sink := formats.Tap(registry.SinkFuncs{OnSet: m.set, OnSynced: m.markSynced})
		go func() { _ = m.Watch(ctx, sink) }()
		ms = append(ms, m)
	}
	waitAll(b, "every cluster's first sync", 5*time.Minute, func() bool { return synced(ms) })

	// Every cluster but the last exports everything; then the last one's
	// bulk export is timed to its last import in the others.
	seedStart := time.Now()
	publishAll(ctx, b, s, ms[:len(ms)-1])
	fmt.Printf("fleet: %d clusters published %d services each in %v\n", len(ms)-1, s.services, time.Since(seedStart).Round(time.Second))
	last := len(ms) - 1
	lastName := fmt.Sprintf("cluster-%02d", last)
	before := ms[last].calls.Snapshot()
	allBefore, throttledBefore := total(ms, false), total(ms, true)
	bulkStart := time.Now()
	publishAll(ctx, b, s, ms[last:])
	published := time.Since(bulkStart)
	bulkCalls, _ := controlPlane(diffMap(before, ms[last].calls.Snapshot()))
	bulkDone := waitHeard(ctx, b, srv, s, ms[:last], lastName, 0, 15*time.Minute)
	r := fleetResult{bulk: bulkDone.Sub(bulkStart)}
	// What the whole fleet called meanwhile, and what the quotas refused:
	// where a slow bulk spent its time.
	fmt.Printf("fleet: calls of all clusters during the bulk export (%v), throttled in brackets:", r.bulk.Round(time.Second))
	bulkAll, bulkThrottled := diffMap(allBefore, total(ms, false)), diffMap(throttledBefore, total(ms, true))
	for _, op := range sortedKeys(bulkAll) {
		fmt.Printf(" %s %.0f (%.0f);", op, bulkAll[op], bulkThrottled[op])
	}
	fmt.Println()

	// Idle: every cluster's calls over a window, once the bulk settled.
	idle := map[string]float64{}
	if window > 0 {
		time.Sleep(30 * time.Second)
		before := snapshots(ms)
		time.Sleep(window)
		for i, m := range ms {
			for op, n := range diffMap(before[i], m.calls.Snapshot()) {
				idle[op] += n / window.Seconds()
			}
		}
	}

	// Pod changes: one more pod in one cluster's small service, each
	// timed to the moment the last of the others heard it; a burst back
	// to back, then each after a quiet spell past the fast polls of the
	// one before heard (its importers poll at the slow rhythm again).
	quiet := m.watch.ActiveWindow + time.Second
	for n := range 2 * changes {
		if n >= changes {
			time.Sleep(quiet)
		}
		c, i := n%s.clusters, 3+n*7%(s.services-3)
		e := s.export(c, i, 1+n/(s.services-3))
		start := time.Now()
		if err := ms[c].Publish(ctx, e); err != nil {
			b.Fatal(err)
		}
		var lastAt time.Time
		slowest := ""
		for j, m := range ms {
			if j == c {
				continue
			}
			for {
				at, ok := m.has(e.Key, e.Cluster, len(e.Endpoints))
				if ok {
					if at.After(lastAt) {
						lastAt, slowest = at, m.Cluster()
					}
					break
				}
				if time.Since(start) > 2*time.Minute {
					m.mu.Lock()
					seen := m.seen[e.Key]
					m.mu.Unlock()
					heard := 0
					for k, o := range ms {
						if _, ok := o.has(e.Key, e.Cluster, len(e.Endpoints)); ok && k != c {
							heard++
						}
					}
					b.Fatalf("change %d of %s (%d endpoints of %s) not heard by cluster-%02d in 2 minutes (%d of the %d others heard it); it last heard %v; Cloud Map holds %v",
						n, e.Key, len(e.Endpoints), e.Cluster, j, heard, len(ms)-1, seen, holds(ctx, b, srv, e.Key))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		// Each change as it went: a long run shows where it is.
		fmt.Printf("fleet: change %d (%s of %s): heard by all %d others in %v, last by %s\n", n, e.Key, e.Cluster, len(ms)-1, lastAt.Sub(start).Round(time.Millisecond), slowest)
		if n < changes {
			r.burst = append(r.burst, lastAt.Sub(start))
		} else {
			r.quiet = append(r.quiet, lastAt.Sub(start))
		}
	}

	// Instances against the quotas, as Cloud Map holds them.
	perService, perNamespace := instanceUsage(ctx, b, srv, s)
	fmt.Printf("Fleet at the shipped defaults (each cluster 20 control-plane + 200 Discover* calls/s, 1.5 s poll, packed records), %d clusters x %d services over %d namespaces, one emulator under the %s profile, %d cores:\n",
		s.clusters, s.services, s.namespaces, m.profile.Name, runtimeCores())
	fmt.Printf("  one cluster's bulk export of %d services: written in %v (%.0f control-plane calls)\n", s.services, published.Round(100*time.Millisecond), bulkCalls)
	within(b, fmt.Sprintf("bulk export imported by all %d others", last), r.bulk, max(writeFloor(bulkCalls), readFloor(last, s.services))+m.changeBound(),
		fmt.Sprintf("the longer of the write floor %v (its calls at %d/s) and the read floor %v (%d importers x %d services at the account's 1,000 DiscoverInstances/s), + a change's bound %v",
			writeFloor(bulkCalls).Round(100*time.Millisecond), cloudmapclient.DefaultQPS, readFloor(last, s.services).Round(100*time.Millisecond), last, s.services, m.changeBound()))
	fmt.Printf("  a pod change to all %d others, %d in a burst: p50 %v\n", s.clusters-1, changes, percentile(r.burst, 50).Round(time.Millisecond))
	within(b, "  ... burst p99", percentile(r.burst, 99), m.changeBound(), m.changeWhy())
	fmt.Printf("  a pod change to all %d others, %d each after %v quiet: p50 %v\n", s.clusters-1, changes, quiet, percentile(r.quiet, 50).Round(time.Millisecond))
	within(b, "  ... quiet p99", percentile(r.quiet, 99), m.changeBound(), m.changeWhy())
	if window > 0 {
		fmt.Printf("  idle, whole fleet, calls/s over %v:\n", window)
		limits := map[string]float64{"DiscoverInstances": 1000, "DiscoverInstancesRevision": 3000}
		for _, op := range sortedKeys(idle) {
			share := "control plane: no published limit"
			if l, ok := limits[op]; ok {
				share = fmt.Sprintf("%.1f%% of the account's %.0f/s", 100*idle[op]/l, l)
			}
			fmt.Printf("    %-28s %8.2f/s (%.2f per cluster per minute)  %s\n", op, idle[op], 60*idle[op]/float64(s.clusters), share)
		}
	}
	calls, throttled := total(ms, false), total(ms, true)
	fmt.Printf("  throttled by the account's quotas over the whole run (all clusters):")
	if len(throttled) == 0 {
		fmt.Printf(" none")
	}
	for _, op := range sortedKeys(throttled) {
		fmt.Printf(" %s %.0f of %.0f calls (%.2f%%);", op, throttled[op], calls[op], 100*throttled[op]/calls[op])
	}
	fmt.Println()
	atMost(b, "instances in the fullest service", float64(perService), recordfmt.MaxInstances, "Cloud Map's fixed quota per service")
	atMost(b, "instances in the fullest namespace", float64(perNamespace), cloudmap.DefaultNamespaceQuota, "the default quota per namespace")
	fmt.Printf("  %d namespaces of 50\n", s.namespaces)
	return r
}

// publishAll has each member publish every service, at once (each within
// its own call budget).
func publishAll(ctx context.Context, b testing.TB, s fleetShape, ms []*fleetMember) {
	var wg sync.WaitGroup
	for _, m := range ms {
		var c int
		fmt.Sscanf(m.Backend.Cluster(), "cluster-%d", &c)
		wg.Go(func() { publishEvery(ctx, b, s, c, m.Publish, 8) })
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// publishEvery publishes every service of member c, workers at a time (the
// export reconciler runs 4).
func publishEvery(ctx context.Context, b testing.TB, s fleetShape, c int, publish func(context.Context, registry.Export) error, workers int) {
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i := range s.services {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := publishRetrying(ctx, publish, s.export(c, i, 0)); err != nil {
				b.Errorf("cluster-%02d %s: %v", c, s.key(i), err)
			}
		})
	}
	wg.Wait()
}

// publishRetrying publishes e until it is written, a second between
// tries, as the export reconciler retries; it gives up on an export past
// Cloud Map's limits (a LimitError, returned) or when ctx ends.
func publishRetrying(ctx context.Context, publish func(context.Context, registry.Export) error, e registry.Export) error {
	for {
		err := publish(ctx, e)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if _, limit := err.(*recordfmt.LimitError); limit {
			return err
		}
		time.Sleep(time.Second)
	}
}

// waitHeard waits until every member heard every service of cluster in
// full, and returns when the last was heard. It prints how many are left
// each minute, and when it gives up, how many and what Cloud Map holds of
// the first: whether a change is slow or lost.
func waitHeard(ctx context.Context, b testing.TB, srv *cloudmaptest.Emulator, s fleetShape, ms []*fleetMember, cluster string, extra int, within time.Duration) time.Time {
	var c int
	fmt.Sscanf(cluster, "cluster-%d", &c)
	want := make([]int, s.services)
	for i := range want {
		want[i] = len(s.export(c, i, extra).Endpoints)
	}
	var last time.Time
	start := time.Now()
	deadline, report := start.Add(within), start.Add(time.Minute)
	for {
		left, first, firstKey := 0, "", registry.Key{}
		for _, m := range ms {
			for i := range s.services {
				at, ok := m.has(s.key(i), cluster, want[i])
				if !ok {
					if left == 0 {
						m.mu.Lock()
						first, firstKey = fmt.Sprintf("%s has not heard %s's %d endpoints of %s: it last heard %v", m.Cluster(), cluster, want[i], s.key(i), m.seen[s.key(i)]), s.key(i)
						m.mu.Unlock()
					}
					left++
					continue
				}
				last = maxTime(last, at)
			}
		}
		if left == 0 {
			return last
		}
		if now := time.Now(); now.After(deadline) {
			b.Fatalf("not every export of %s heard everywhere within %v: %d of %d left; %s; Cloud Map holds %v",
				cluster, within, left, len(ms)*s.services, first, holds(ctx, b, srv, firstKey))
		} else if now.After(report) {
			fmt.Printf("fleet: %v after the bulk export, %d of %d imports of it left\n", now.Sub(start).Round(time.Second), left, len(ms)*s.services)
			report = report.Add(time.Minute)
		}
		time.Sleep(time.Second)
	}
}

// benchLog writes a cluster's registry log to stderr when
// CLUSTERMAP_BENCH_LOG is set (errors only: the registry logs little else).
func benchLog(cluster string) logr.Logger {
	if os.Getenv("CLUSTERMAP_BENCH_LOG") == "" {
		return logr.Discard()
	}
	return funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, time.Now().Format("15:04:05.000"), cluster, prefix, args)
	}, funcr.Options{})
}

// holds is what Cloud Map holds of a service: instances and the endpoints
// they decode to, by cluster.
func holds(ctx context.Context, b testing.TB, srv *cloudmaptest.Emulator, key registry.Key) map[string]string {
	out, err := srv.Client(b, cloudmapclient.Options{}).DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(key.Namespace), ServiceName: aws.String(key.Name), MaxResults: aws.Int32(1000)})
	if err != nil {
		b.Fatal(err)
	}
	n := map[string]int{}
	var records []recordfmt.Instance
	for _, i := range out.Instances {
		n[i.Attributes[recordfmt.AttrClusterID]]++
		records = append(records, recordfmt.Instance{ID: aws.ToString(i.InstanceId), Attrs: i.Attributes})
	}
	held := map[string]string{}
	for _, e := range recordfmt.Decode(key, records) {
		held[e.Cluster] = fmt.Sprintf("%d instances, %d endpoints", n[e.Cluster], len(e.Endpoints))
	}
	return held
}

func waitAll(b testing.TB, what string, within time.Duration, ok func() bool) {
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			b.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// synced says whether every member's watch has synced.
func synced(ms []*fleetMember) bool {
	for _, m := range ms {
		m.mu.Lock()
		ok := m.synced
		m.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// total sums every cluster's calls by operation, or those throttled.
func total(ms []*fleetMember, throttled bool) map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		c := m.calls
		if throttled {
			c = m.throttled
		}
		for op, n := range c.Snapshot() {
			out[op] += n
		}
	}
	return out
}

func snapshots(ms []*fleetMember) []map[string]float64 {
	out := make([]map[string]float64, len(ms))
	for i, m := range ms {
		out[i] = m.calls.Snapshot()
	}
	return out
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// instanceUsage reads Cloud Map's instances: the fullest service's and
// the fullest namespace's.
func instanceUsage(ctx context.Context, b testing.TB, srv *cloudmaptest.Emulator, s fleetShape) (perService, perNamespace int) {
	c := srv.Client(b, cloudmapclient.Options{})
	ns := map[string]int{}
	for i := range s.services {
		k := s.key(i)
		out, err := c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String(k.Namespace), ServiceName: aws.String(k.Name), MaxResults: aws.Int32(1000)})
		if err != nil {
			b.Fatal(err)
		}
		perService = max(perService, len(out.Instances))
		ns[k.Namespace] += len(out.Instances)
	}
	for _, n := range ns {
		perNamespace = max(perNamespace, n)
	}
	return perService, perNamespace
}
