//go:build e2e

package cloudmap

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
)

// fleet is an emulator with its quotas on, and clusters of clusterset
// "set" on it, each the controller's registry side: its own client at the
// shipped call budgets, its format choice, and what its watch told.
type fleet struct {
	t   *testing.T
	srv *cloudmaptest.Emulator
	// observer is the test's own client, within a call budget of its own
	// so that its polls wait rather than be throttled.
	observer *sd.Client
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetWith(t, cloudmaplocal.Options{})
}

func newFleetWith(t *testing.T, o cloudmaplocal.Options) *fleet {
	t.Helper()
	srv := cloudmaptest.Start(t, o)
	return &fleet{t: t, srv: srv, observer: srv.Client(t, cloudmapclient.Options{QPS: 10, Burst: 10})}
}

type member struct {
	*Backend
	formats *recordfmt.Formats
	calls   *cloudmapclient.Calls
	stop    context.CancelFunc
	// rechoose hears each new format choice: the export reconciler
	// publishes every export again then.
	rechoose chan recordfmt.Choice

	mu     sync.Mutex
	heard  map[registry.Key][]registry.Export
	synced bool
	onSet  func(registry.Key, []registry.Export)
	// sinks hear what the member's one watch hears (attach).
	sinks []registry.Sink
	// published are the exports last published, written again when a
	// write fails after Cloud Map accepted it, as the export reconciler
	// does (OnWriteFailed).
	published map[registry.Key]registry.Export
}

// Publish publishes as the export reconciler does: again a second later
// after an error (a write still running, a namespace creation that failed
// late), every LateFailureRetry while a write failed after Cloud Map
// accepted it; a quota refusal is final (keepPublishing tries it again, as
// the export reconciler does). Up to 5 minutes.
func (m *member) Publish(ctx context.Context, e registry.Export) error {
	m.mu.Lock()
	m.published[e.Key] = e
	m.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Minute); ; {
		err := m.Backend.Publish(ctx, e)
		var late *registry.LateFailureError
		var limit *recordfmt.LimitError
		wait := time.Second
		switch {
		case err == nil, errors.As(err, &limit):
			return err
		case errors.As(err, &late):
			wait = registry.LateFailureRetry
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// Withdraw forgets the export first: a late failure must not publish it
// again (the export reconciler withdraws a deleted ServiceExport).
func (m *member) Withdraw(ctx context.Context, key registry.Key) error {
	m.mu.Lock()
	delete(m.published, key)
	m.mu.Unlock()
	return m.Backend.Withdraw(ctx, key)
}

// attached is a member's registry whose Watch hears the member's running
// watch: a backend has one watch, as in the controller.
type attached struct{ *member }

func (a attached) Watch(ctx context.Context, sink registry.Sink) error {
	a.mu.Lock()
	for k, e := range a.heard {
		sink.Set(k, e)
	}
	sink.Synced()
	a.sinks = append(a.sinks, sink)
	a.mu.Unlock()
	<-ctx.Done()
	return nil
}

// join starts a cluster writing record format version (0: this release's),
// and waits for its watch's first sync.
func (f *fleet) join(cluster string, version int) *member {
	f.t.Helper()
	return f.start(cluster, version, false)
}

func (f *fleet) start(cluster string, version int, perEndpoint bool) *member {
	f.t.Helper()
	return f.startIn("set", cluster, version, perEndpoint)
}

func (f *fleet) startIn(set, cluster string, version int, perEndpoint bool) *member {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	m := &member{calls: &cloudmapclient.Calls{}, stop: cancel, heard: map[registry.Key][]registry.Export{}, rechoose: make(chan recordfmt.Choice, 16),
		published: map[registry.Key]registry.Export{}}
	co := f.srv.Shipped()
	co.OnCall = m.calls.Record
	c := f.srv.Client(f.t, co)
	o := Options{ClusterSet: set, Cluster: cluster, Controller: "clustermap test", Log: logr.Discard(), RecordVersion: version, Usage: NewUsage(0),
		Observer: registry.ObserverFuncs{OnWriteFailed: func(key registry.Key) {
			m.mu.Lock()
			e, ok := m.published[key]
			m.mu.Unlock()
			if ok {
				go func() { _ = m.Publish(ctx, e) }()
			}
		}}}
	var sink registry.Sink = registry.SinkFuncs{
		OnSet: func(key registry.Key, e []registry.Export) {
			m.mu.Lock()
			m.heard[key] = e
			on := m.onSet
			for _, s := range m.sinks {
				s.Set(key, e)
			}
			m.mu.Unlock()
			if on != nil {
				on(key, e)
			}
		},
		OnSynced: func() {
			m.mu.Lock()
			m.synced = true
			m.mu.Unlock()
		},
	}
	if version == 0 || version >= recordfmt.PackedVersion {
		m.formats = &recordfmt.Formats{Cluster: cluster, PerEndpoint: perEndpoint, OnChoice: func(c recordfmt.Choice, switched bool) {
			if switched {
				m.rechoose <- c
			}
		}}
		o.Formats = m.formats
		sink = m.formats.Tap(sink)
	}
	m.Backend = New(c, o)
	go func() { _ = m.Watch(ctx, sink) }()
	f.waitFor(cluster+"'s first sync", time.Minute, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.synced
	})
	return m
}

func (f *fleet) waitFor(what string, within time.Duration, ok func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			f.t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// calls sums ms's calls of ops.
func calls(ms []*member, ops ...string) (n float64) {
	for _, m := range ms {
		snap := m.calls.Snapshot()
		for _, op := range ops {
			n += snap[op]
		}
	}
	return n
}

// awaitRecordsFeed waits until importers stop looking up operations
// (GetOperation): past 5 clusters, each does once it has read the
// others' records (every ProofReadInterval) and counted the clusterset,
// though the profile's other tenants write every second. It returns
// their lookups by then.
func (f *fleet) awaitRecordsFeed(importers []*member) float64 {
	f.t.Helper()
	was := calls(importers, "GetOperation")
	f.waitFor("the importers to stop looking up operations", time.Minute, func() bool {
		time.Sleep(5 * time.Second)
		n := calls(importers, "GetOperation")
		defer func() { was = n }()
		return n == was
	})
	return was
}

// endpoints is how many endpoint records of each cluster m last heard of.
func (m *member) endpoints(key registry.Key) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, e := range m.heard[key] {
		out[e.Cluster] = len(e.Endpoints)
	}
	return out
}

// instances counts what Cloud Map holds in a service, by cluster: what
// finished operations wrote (ListInstances), which a lagging read
// (DiscoverInstances) may not show yet.
func (f *fleet) instances(key registry.Key) map[string]int {
	f.t.Helper()
	ctx, c := context.Background(), f.observer
	n := map[string]int{}
	svcs, err := c.ListServices(ctx, &sd.ListServicesInput{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, svc := range svcs.Services {
		if aws.ToString(svc.Name) != key.Name {
			continue
		}
		pages := sd.NewListInstancesPaginator(c, &sd.ListInstancesInput{ServiceId: svc.Id})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				f.t.Fatal(err)
			}
			for _, in := range page.Instances {
				n[in.Attributes[recordfmt.AttrClusterID]]++
			}
		}
	}
	return n
}

// A Service of 2,000 dual-stack pods with 3 ports in each of 10 clusters
// (120,000 endpoint records) exports and imports in full inside Cloud
// Map's quota of 1,000 instances per service, and one DiscoverInstances
// reads it whole.
func TestFleetServiceFitsTheQuota(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 10-cluster fleet")
	}
	f := newFleet(t)
	const clusters, pods = 10, 2000
	var ms []*member
	for i := range clusters {
		ms = append(ms, f.join(fmt.Sprintf("c%d", i), 0))
	}
	key := recordfmttest.FleetExport("c0", 0, true).Key
	importer := ms[0]
	before := importer.calls.Snapshot()["DiscoverInstances"]
	start := time.Now()
	errs := make(chan error, clusters)
	for i, m := range ms {
		go func() {
			errs <- m.Publish(context.Background(), clusterAddresses(recordfmttest.FleetExport(fmt.Sprintf("c%d", i), pods, true, recordfmttest.ThreePorts...), i))
		}()
	}
	for range clusters {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	published := time.Since(start)
	f.waitFor("every cluster's 12,000 endpoint records imported", 2*time.Minute, func() bool {
		got := importer.endpoints(key)
		if len(got) != clusters {
			return false
		}
		for _, n := range got {
			if n != pods*2*len(recordfmttest.ThreePorts) {
				return false
			}
		}
		return true
	})
	total := 0
	for _, n := range f.instances(key) {
		total += n
	}
	if total > recordfmt.MaxInstances {
		t.Errorf("%d instances in one service, past the quota of %d", total, recordfmt.MaxInstances)
	}
	if c := importer.formats.Choose(); !c.Packed {
		t.Errorf("c0 writes %s", c)
	}
	t.Logf("%d clusters x %d dual-stack pods x %d ports: %d endpoint records in %d instances; published in %v, read whole by c0 in %v with %.0f DiscoverInstances calls in all",
		clusters, pods, len(recordfmttest.ThreePorts), clusters*pods*2*len(recordfmttest.ThreePorts), total, published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		importer.calls.Snapshot()["DiscoverInstances"]-before)
}

// clusterAddresses moves an export's addresses into cluster i's own pod
// ranges (10.<i+1>.x.x, fd00:<i+1>::x).
func clusterAddresses(e registry.Export, i int) registry.Export {
	for j, ep := range e.Endpoints {
		if ip := ep.IP; len(ip) > 5 && ip[:5] == "10.1." {
			e.Endpoints[j].IP = fmt.Sprintf("10.%d.%s", i+1, ip[5:])
		} else if len(ip) > 9 && ip[:9] == "fd00:10:1" {
			e.Endpoints[j].IP = fmt.Sprintf("fd00:10:%x%s", i+1, ip[9:])
		}
	}
	return e
}

// A clusterset mid-upgrade: while cluster c3 runs the previous release
// (record format 2), every cluster writes per-endpoint records; once c3
// runs this one, each learns it from the registry and switches to packed
// records by itself, once, and an importer sampling every read never sees
// a cluster with an endpoint missing.
func TestFormatSwitchLosesNoEndpoint(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	const pods = 40 // 80 records per cluster: 4 s of registrations each at the shipped 20 calls per second
	exp := func(i int) registry.Export {
		return clusterAddresses(recordfmttest.FleetExport(fmt.Sprintf("c%d", i), pods, false, recordfmttest.ThreePorts[:2]...), i)
	}
	key, want := exp(0).Key, pods*2
	importer := f.join("c0", 0)
	var mu sync.Mutex
	full := map[string]bool{}
	var short []string
	importer.onSet = func(_ registry.Key, es []registry.Export) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range es {
			switch n := len(e.Endpoints); {
			case n == want:
				full[e.Cluster] = true
			case full[e.Cluster]:
				short = append(short, fmt.Sprintf("%s with %d of %d endpoints", e.Cluster, n, want))
			}
		}
	}
	old := f.join("c3", 2)
	if err := old.Publish(context.Background(), exp(3)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	switched := map[string]int{}
	var ms []*member
	for i := 1; i <= 2; i++ {
		m := f.join(fmt.Sprintf("c%d", i), 0)
		ms = append(ms, m)
		go func() {
			for c := range m.rechoose {
				// As the export reconciler does on a new choice.
				if c.Known && m.Publish(ctx, exp(i)) == nil && c.Packed {
					mu.Lock()
					switched[m.Cluster()]++
					mu.Unlock()
				}
			}
		}()
		if err := m.Publish(ctx, exp(i)); err != nil {
			t.Fatal(err)
		}
	}
	lastLog := time.Now()
	everyone := func(instances int) func() bool {
		return func() bool {
			got, n := importer.endpoints(key), f.instances(key)
			for _, c := range []string{"c1", "c2", "c3"} {
				if got[c] != want || instances > 0 && n[c] != instances {
					if time.Since(lastLog) > 10*time.Second {
						lastLog = time.Now()
						t.Logf("the importer has %v endpoints, Cloud Map %v instances", got, n)
					}
					return false
				}
			}
			return true
		}
	}
	f.waitFor("three per-endpoint exports imported", 3*time.Minute, everyone(want+1))
	for _, m := range ms {
		if c := m.formats.Choose(); c.Packed {
			t.Fatalf("%s writes %s beside a cluster of format 2", m.Cluster(), c)
		}
	}

	// c3 upgrades: it restarts on this release and publishes its export.
	old.stop()
	upgraded := f.join("c3", 0)
	go func() {
		// As the export reconciler does on a new choice: its first reads
		// may still show its records of format 2 (reads trail writes).
		for c := range upgraded.rechoose {
			if c.Known {
				_ = upgraded.Publish(ctx, exp(3))
			}
		}
	}()
	if err := upgraded.Publish(ctx, exp(3)); err != nil {
		t.Fatal(err)
	}
	f.waitFor("every cluster in one packed instance", 3*time.Minute, everyone(1))
	// The publish that switched returns once the per-endpoint records it
	// took out are gone, which may be after the importer read the packed one.
	f.waitFor("the switching publishes returned", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return switched["c1"] > 0 && switched["c2"] > 0
	})
	time.Sleep(2 * time.Second) // the last reads after the switch
	mu.Lock()
	defer mu.Unlock()
	if len(short) > 0 {
		t.Errorf("the importer read %d exports short through the switch: %v", len(short), short)
	}
	for _, m := range ms {
		if switched[m.Cluster()] != 1 {
			t.Errorf("%s switched to packed records %d times, want once", m.Cluster(), switched[m.Cluster()])
		}
	}
	if c := upgraded.formats.Choose(); !c.Packed {
		t.Errorf("the upgraded c3 writes %s", c)
	}
}

// Three clusters of 180 pods with 2 ports each, kept per endpoint (1,083
// instances), exported one after another: the third export, which cannot
// fit, is refused whole, with the quota and the numbers, and nothing of it
// is imported. In packed records all three fit in three instances.
func TestExportPastTheQuotaIsRefusedWhole(t *testing.T) {
	t.Parallel()
	key, want := quotaExport(0).Key, quotaPods*2
	f := newFleet(t)
	importer := f.join("c0", 0)
	var ms []*member
	for i := 1; i <= 3; i++ {
		ms = append(ms, f.start(fmt.Sprintf("c%d", i), 0, true))
	}
	total := 0
	for i, m := range ms {
		err := m.Publish(context.Background(), quotaExport(i+1))
		var limit *recordfmt.LimitError
		switch {
		case err == nil && i < 2:
			total += want + 1
			// Each exporter has read the ones before.
			f.waitFor("the exports read", time.Minute, func() bool { return readBy(ms, key, total) })
		case errors.As(err, &limit) && i == 2:
			t.Logf("c3 refused: %s", limit.Reason)
			if !strings.Contains(limit.Reason, "1000") {
				t.Errorf("the reason names no quota: %s", limit.Reason)
			}
		default:
			t.Fatalf("c%d: %v", i+1, err)
		}
	}
	time.Sleep(3 * time.Second) // the importer's reads after the last change
	f.waitFor("the two exports that fit imported whole, the third not at all", 3*time.Minute, func() bool {
		got := importer.endpoints(key)
		return len(got) == 2 && got["c1"] == want && got["c2"] == want
	})
	if n := f.instances(key); len(n) != 2 {
		t.Errorf("instances by cluster %v: the refused export left records", n)
	}
}

// Three clusters exporting the exports above at the same moment, each
// tried again as the export reconciler does (keepPublishing): Cloud Map
// refuses some midway (under the realistic profile, a registration
// accepted before the service filled fails as it applies), and those take
// back what they added and are refused whole, then try again at times of
// their own. They settle: two exports whole, the third refused with
// nothing of it left.
func TestExportsPastTheQuotaAtOnceSettle(t *testing.T) {
	t.Parallel()
	key, want := quotaExport(0).Key, quotaPods*2
	f := newFleet(t)
	importer := f.join("c0", 0)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	refusals := make([]atomic.Int32, 3)
	var members []*member
	for i := 1; i <= 3; i++ {
		m := f.start(fmt.Sprintf("c%d", i), 0, true)
		members = append(members, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			keepPublishing(ctx, m, quotaExport(i), &refusals[i-1])
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	// A round of collisions costs up to about 2.5 minutes: the take-back
	// (up to 30 s), the retry (up to 90 s), the registrations (18 s at
	// 20/s) and the service record after them (up to 30 s). How many
	// rounds it takes is chance (the retries are spread at random): here
	// it settled after 3, 4 and 8 refusals (127, 154 and 352 s) with the
	// machine loaded, and a clean-clone run met 9 refusals in 8 minutes
	// without settling. Five rounds more than the first are waited for.
	for deadline := time.Now().Add(15 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got := importer.endpoints(key)
		whole := 0
		for _, n := range got {
			if n == want {
				whole++
			}
		}
		if whole == 2 && len(got) == 2 {
			break
		}
		if time.Now().After(deadline) {
			for _, m := range members {
				m.mu.Lock()
				t.Logf("%s: %d records it would take back, %d recent writes, registrations waited for: %v",
					m.Cluster(), len(m.tried[key]), len(m.recent[key]), m.registering[key].at)
				m.mu.Unlock()
			}
			t.Fatalf("no two exports imported whole and the third not at all within 15m: imported %v, instances by cluster %v, refusals %d %d %d",
				got, f.instances(key), refusals[0].Load(), refusals[1].Load(), refusals[2].Load())
		}
	}
	if n := f.instances(key); len(n) != 2 {
		t.Errorf("instances by cluster %v: the refused export left records", n)
	}
	refused := 0
	for i := range refusals {
		refused += int(refusals[i].Load())
	}
	if refused == 0 {
		t.Error("no export was refused: 1,083 instances went into one service")
	}
	t.Logf("quota refusals on the way: %d", refused)
}

const quotaPods = 180

// quotaExport is cluster i's export of 180 pods with 2 ports: 361 records
// kept per endpoint.
func quotaExport(i int) registry.Export {
	return clusterAddresses(recordfmttest.FleetExport(fmt.Sprintf("c%d", i), quotaPods, false, recordfmttest.ThreePorts[:2]...), i)
}

// keepPublishing publishes e until ctx ends, as the export reconciler
// does: again after the time a refusal names, every LateFailureRetry
// while a write failed late, a second after any other error, and 10 s
// after a success (a late failure heard meanwhile shows then).
func keepPublishing(ctx context.Context, m *member, e registry.Export, refusals *atomic.Int32) {
	for ctx.Err() == nil {
		err := m.Backend.Publish(ctx, e)
		var refused registry.Refused
		var late *registry.LateFailureError
		var limit *recordfmt.LimitError
		wait := time.Second
		switch {
		case err == nil:
			wait = 10 * time.Second
		case errors.As(err, &limit):
			refusals.Add(1)
			wait = limit.Refusal().Retry
		case errors.As(err, &late):
			wait = registry.LateFailureRetry
		case errors.As(err, &refused):
			wait = refused.Refusal().Retry
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// readBy says whether each member has read a service's instances.
func readBy(ms []*member, key registry.Key, atLeast int) bool {
	for _, m := range ms {
		m.o.Usage.mu.Lock()
		n := m.o.Usage.counts["us-east-1"][key]
		m.o.Usage.mu.Unlock()
		if n < atLeast {
			return false
		}
	}
	return true
}

// Cloud Map behaves as the memory registry does (registrytest), at the
// shipped defaults, in both record formats.
func TestRegistrySuite(t *testing.T) {
	t.Parallel()
	for _, perEndpoint := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-endpoint=%v", perEndpoint), func(t *testing.T) {
			registrytest.Run(t, func(t *testing.T) registrytest.New {
				f := newFleet(t)
				return func(t *testing.T, set, cluster string) registry.Registry {
					f.t = t
					return attached{f.startIn(set, cluster, 0, perEndpoint)}
				}
			})
		})
	}
}

// In a one-account clusterset larger than its importers can look up
// every operation for (byRecords: past 5 clusters), a change reaches
// every importer from the change records, and no importer looks up
// another's operation or other tenants' (GetOperation): at 50 clusters
// those lookups alone took the account's quota.
func TestLargeClustersetReadsChangesFromRecords(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	const clusters = 7
	exp := func(i, pods int) registry.Export {
		return clusterAddresses(recordfmttest.FleetExport(fmt.Sprintf("c%d", i), pods, false, recordfmttest.ThreePorts[:1]...), i)
	}
	key := exp(0, 1).Key
	var ms []*member
	for i := range clusters {
		m := f.join(fmt.Sprintf("c%d", i), 0)
		if err := m.Publish(context.Background(), exp(i, 1)); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	heardAll := func(cluster string, endpoints int) bool {
		for _, m := range ms {
			if m.Cluster() != cluster && m.endpoints(key)[cluster] != endpoints {
				return false
			}
		}
		return true
	}
	for _, m := range ms {
		f.waitFor(m.Cluster()+"'s export everywhere", time.Minute, func() bool { return heardAll(m.Cluster(), 1) })
	}
	before := f.awaitRecordsFeed(ms[1:])
	if err := ms[0].Publish(context.Background(), exp(0, 2)); err != nil {
		t.Fatal(err)
	}
	f.waitFor("c0's change everywhere", time.Minute, func() bool { return heardAll("c0", 2) })
	if n := calls(ms[1:], "GetOperation") - before; n > 0 {
		t.Errorf("the importers looked up %.0f operations (GetOperation) while the change went through; want none: the records say what changed", n)
	}
}

// A bulk export in a clusterset read from the change records: the
// exporter's 60 changes come faster than a record of single slots held
// (24 before, a record write every 2 s at 20 calls a second), and every
// importer reads them from the records, none catching up (listing the
// clusterset and checking every service's revision).
func TestBulkExportIsReadFromTheRecords(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	const clusters, bulk = 6, 60
	exp := func(i, svc int) registry.Export {
		e := clusterAddresses(recordfmttest.FleetExport(fmt.Sprintf("c%d", i), 1, false, recordfmttest.ThreePorts[:1]...), i)
		e.Key.Name = fmt.Sprintf("bulk-%02d", svc)
		return e
	}
	var ms []*member
	for i := range clusters {
		m := f.join(fmt.Sprintf("c%d", i), 0)
		if err := m.Publish(context.Background(), exp(i, 0)); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	heard := func(key registry.Key) bool {
		for _, m := range ms[1:] {
			if m.endpoints(key)["c0"] != 1 {
				return false
			}
		}
		return true
	}
	for _, m := range ms {
		f.waitFor(m.Cluster()+"'s export everywhere", time.Minute, func() bool {
			for _, o := range ms {
				if o != m && o.endpoints(exp(0, 0).Key)[m.Cluster()] != 1 {
					return false
				}
			}
			return true
		})
	}
	listings := func() float64 { return calls(ms[1:], "ListServices", "ListNamespaces") }
	f.awaitRecordsFeed(ms[1:])
	before := listings()
	var wg sync.WaitGroup
	errs := make(chan error, bulk)
	for svc := 1; svc <= bulk; svc++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- ms[0].Publish(context.Background(), exp(0, svc))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	f.waitFor("c0's bulk everywhere", 2*time.Minute, func() bool {
		for svc := 1; svc <= bulk; svc++ {
			if !heard(exp(0, svc).Key) {
				return false
			}
		}
		return true
	})
	if n := listings() - before; n > 0 {
		t.Errorf("the importers listed the clusterset %.0f times (ListNamespaces, ListServices) while the bulk went through; want none: the records hold every change", n)
	}
}

// A changed service is read again until the read lag has passed; those
// re-reads mostly find the records already read, and then decode and
// report nothing: the sink hears each state of the export once.
func TestUnchangedRereadsReportNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	exp := func(pods int) registry.Export {
		return clusterAddresses(recordfmttest.FleetExport("c1", pods, false, recordfmttest.ThreePorts[:1]...), 1)
	}
	key := exp(1).Key
	importer, exporter := f.join("c0", 0), f.join("c1", 0)
	if err := exporter.Publish(context.Background(), exp(1)); err != nil {
		t.Fatal(err)
	}
	f.waitFor("c1's export in c0", time.Minute, func() bool { return importer.endpoints(key)["c1"] == 1 })
	var mu sync.Mutex
	var sets [][]registry.Export
	importer.mu.Lock()
	importer.onSet = func(k registry.Key, e []registry.Export) {
		if k == key {
			mu.Lock()
			sets = append(sets, e)
			mu.Unlock()
		}
	}
	importer.mu.Unlock()
	reads := importer.calls.Snapshot()["DiscoverInstances"]
	if err := exporter.Publish(context.Background(), exp(2)); err != nil {
		t.Fatal(err)
	}
	f.waitFor("c1's change in c0", time.Minute, func() bool { return importer.endpoints(key)["c1"] == 2 })
	// The re-reads of the change: the watcher's window is the read lag.
	time.Sleep(DefaultReadLag + 2*time.Second)
	reads = importer.calls.Snapshot()["DiscoverInstances"] - reads
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(sets); i++ {
		if reflect.DeepEqual(sets[i-1], sets[i]) {
			t.Errorf("the sink heard the same exports twice in a row (set %d of %d, after %.0f reads)", i+1, len(sets), reads)
		}
	}
	if int(reads) <= len(sets) {
		t.Errorf("%.0f reads and %d reports: the change was not read again", reads, len(sets))
	}
	t.Logf("%.0f reads, %d reports", reads, len(sets))
}

// The instances an importer counts against Cloud Map's quotas are those of
// the reads it takes: a re-read that goes back past the revision held (a
// lagging replica) is ignored, and does not leave the count short of what
// the service holds. Runs under a read lag of 4 s, within the watcher's
// 5 s window but twice the profile's: reads that go back are common then.
// (A count left short had an exporter wait on its own export in
// TestExportPastTheQuotaIsRefusedWhole.)
func TestUsageCountsTheReadsThatStand(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.ReadLag, p.TenantOperations, p.LateFailureRate = 4*time.Second, 0, 0
	f := newFleetWith(t, cloudmaplocal.Options{Profile: &p})
	const services = 24
	exp := func(i, pods int) registry.Export {
		e := clusterAddresses(recordfmttest.FleetExport("c1", pods, false, recordfmttest.ThreePorts[:1]...), 1)
		e.Key.Name = fmt.Sprintf("svc-%d", i)
		return e
	}
	importer, exporter := f.join("c0", 0), f.start("c1", 0, true)
	publishAll := func(pods int) {
		var wg sync.WaitGroup
		for i := range services {
			wg.Go(func() {
				if err := exporter.Publish(context.Background(), exp(i, pods)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		f.waitFor("every change in c0", time.Minute, func() bool {
			for i := range services {
				if importer.endpoints(exp(i, pods).Key)["c1"] != pods {
					return false
				}
			}
			return true
		})
	}
	publishAll(1)
	publishAll(2)
	// A count left short stays short (the reads after show what was
	// reported); one that is right is so once the re-reads of the changes
	// are done, within the read lag of the last.
	var short []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		short = nil
		for i := range services {
			key := exp(i, 0).Key
			held := 0
			for _, n := range f.instances(key) {
				held += n
			}
			for _, m := range []*member{importer, exporter} {
				m.o.Usage.mu.Lock()
				counted := m.o.Usage.counts[cloudmaptest.Region][key]
				m.o.Usage.mu.Unlock()
				if counted != held {
					short = append(short, fmt.Sprintf("%s: %s counts %d instances, Cloud Map holds %d", key, m.o.Cluster, counted, held))
				}
			}
		}
		if len(short) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, s := range short {
		t.Error(s)
	}
}
