//go:build e2e

package cloudmap_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// watched is an emulator with services of this clusterset and of another,
// and a watcher at the shipped call budgets reading it.
type watched struct {
	srv   *cloudmaptest.Emulator
	setup *sd.Client
	calls *cloudmapclient.Calls
	mu    sync.Mutex
	heard map[registry.Key][]registry.Export
	svcs  map[registry.Key]string
	// synced is when the watcher's first listing ended.
	synced time.Time
}

func newWatched(t *testing.T, ours, foreign int) *watched {
	t.Helper()
	ctx := context.Background()
	// Cloud Map as documented, in an account that holds only clustersets:
	// these tests count the watcher's own calls (a busy account is
	// TestBusyAccountPagedWithinBudget's).
	// No late failures either: a change the test makes must happen (the
	// exporter's handling of them is TestLateFailureIsWrittenAgain's).
	p := cloudmaplocal.AWS()
	p.TenantOperations, p.LateFailureRate = 0, 0
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: &p})
	setup := srv.Client(t, cloudmapclient.Options{})
	w := &watched{srv: srv, setup: setup, calls: &cloudmapclient.Calls{}, heard: map[registry.Key][]registry.Export{}, svcs: map[registry.Key]string{}}
	var ops []*string
	for ns, n := range map[string]int{"ours": ours, "theirs": foreign} {
		nsID := cloudmaptest.Namespace(t, setup, ns)
		set := "set"
		if ns == "theirs" {
			set = "another-set"
		}
		for i := 0; i < n; i++ {
			key := registry.Key{Namespace: ns, Name: fmt.Sprintf("svc-%d", i)}
			s, err := setup.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(key.Name), NamespaceId: aws.String(nsID)})
			if err != nil {
				t.Fatal(err)
			}
			w.svcs[key] = aws.ToString(s.Service.Id)
			ops = append(ops, w.register(t, key, set, "10.0.0.1"))
		}
	}
	// The world is set before the watcher starts: every registration done,
	// and past the data plane's lag.
	for _, op := range ops {
		if _, err := cloudmapclient.WaitOperation(ctx, setup, op); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(p.ReadLag)
	return w
}

func (w *watched) register(t *testing.T, key registry.Key, set, ip string) *string {
	t.Helper()
	out, err := w.setup.RegisterInstance(context.Background(), &sd.RegisterInstanceInput{
		ServiceId: aws.String(w.svcs[key]), InstanceId: aws.String("i-" + ip),
		Attributes: map[string]string{recordfmt.AttrIPv4: ip, recordfmt.AttrPort: "80", recordfmt.AttrClusterID: "c1", recordfmt.AttrClusterSetID: set},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.OperationId
}

// start runs a watcher for cluster c2 of clusterset "set", at the shipped
// budgets, and waits for its first sync.
func (w *watched) start(t *testing.T) *cloudmap.Backend {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o := w.srv.Shipped()
	o.OnCall = w.calls.Record
	c := w.srv.Client(t, o)
	synced := make(chan struct{})
	b := cloudmap.New(c, cloudmap.Options{ClusterSet: "set", Cluster: "c2", Controller: "test", Log: logr.Discard()})
	go func() {
		_ = b.Watch(ctx, registry.SinkFuncs{
			OnSet: func(key registry.Key, e []registry.Export) {
				w.mu.Lock()
				defer w.mu.Unlock()
				w.heard[key] = e
			},
			OnSynced: func() { close(synced) },
		})
	}()
	select {
	case <-synced:
		w.synced = time.Now()
	case <-time.After(time.Minute):
		t.Fatal("the watcher did not sync")
	}
	return b
}

// A service the cluster imports that no listing shows (it is gone, or the
// watcher reads the wrong Region or account) is read when checked, as an
// export the sink heard of: its absence is told only once a second read
// confirms it, the shipped 5 s later. One the watcher reads already costs
// nothing more.
func TestCheckReadsAnUnlistedImportAsKnown(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 2, 0)
	b := w.start(t)
	w.settle(t)
	gone, nowhere, listed := registry.Key{Namespace: "ours", Name: "gone"}, registry.Key{Namespace: "nowhere", Name: "x"}, registry.Key{Namespace: "ours", Name: "svc-0"}
	before := w.calls.Snapshot()
	checked := time.Now()
	for _, k := range []registry.Key{gone, nowhere, listed} {
		b.Check(k)
	}
	heard := func(k registry.Key) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		_, ok := w.heard[k]
		return ok
	}
	for !heard(gone) || !heard(nowhere) {
		if time.Since(checked) > 20*time.Second {
			t.Fatal("checked services unlisted were never told of")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(checked); took < 5*time.Second {
		t.Errorf("an absence was told after %v, before a second read could confirm it", took)
	}
	if w.endpoints(gone) != 0 || w.endpoints(nowhere) != 0 || w.endpoints(listed) != 1 {
		t.Errorf("heard %v", w.heard)
	}
	if got := diff(before, w.calls.Snapshot())["DiscoverInstances"]; got != 4 {
		t.Errorf("%v DiscoverInstances, want 4: two reads of each unlisted service, none of the one already read", got)
	}
}

func (w *watched) endpoints(key registry.Key) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.heard[key] {
		n += len(e.Endpoints)
	}
	return n
}

// settle waits until the watcher only polls: 2 s with no other call,
// after the revision checks that follow its first listing (ReadLag and
// OperationWait + ReadLag after it).
func (w *watched) settle(t *testing.T) {
	t.Helper()
	time.Sleep(time.Until(w.synced.Add(cloudmap.DefaultOperationWait + cloudmap.DefaultReadLag)))
	deadline := time.Now().Add(time.Minute)
	for {
		before := w.calls.Snapshot()
		time.Sleep(2 * time.Second)
		d := diff(before, w.calls.Snapshot())
		delete(d, "ListOperations")
		if len(d) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watcher does not settle: %v", d)
		}
	}
}

func diff(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if v != before[k] {
			out[k] = v - before[k]
		}
	}
	return out
}

// After an outage longer than the operations overlap, the watcher reads the
// missed window back from its last successful poll; it does not re-read
// every service (which, at 20 calls/s, kept the next gap long enough to do
// it again).
func TestOutageIsReadBackNotRereadEverything(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 150, 150)
	w.start(t)
	w.settle(t)
	w.srv.SetFaults(cloudmaplocal.Faults{Outage: true})
	time.Sleep(15 * time.Second) // longer than the 10 s overlap
	before := w.calls.Snapshot()
	w.srv.SetFaults(cloudmaplocal.Faults{})
	w.register(t, registry.Key{Namespace: "ours", Name: "svc-7"}, "set", "10.0.0.2")
	deadline := time.Now().Add(10 * time.Second)
	for w.endpoints(registry.Key{Namespace: "ours", Name: "svc-7"}) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("a change after the outage was not read")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	got := diff(before, w.calls.Snapshot())
	// A few calls: the changed service's reads, and the proofs of life
	// (read every 10 s, and after a heartbeat: a revision check each).
	if got["DiscoverInstances"] > 5 || got["DiscoverInstancesRevision"] > 5 {
		t.Errorf("after the outage: %v; want the missed window read back, not 300 services re-read", got)
	}
	t.Logf("calls in the 3 s after the change following a 15 s outage: %v", got)
}

// A call whose connection hangs is given up after the shipped 10 s and
// tried again: the change feed goes on (it stalled for good before).
func TestHungCallsDoNotStallTheFeed(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 5, 0)
	w.start(t)
	w.settle(t)
	w.srv.SetFaults(cloudmaplocal.Faults{Hang: true})
	time.Sleep(2 * time.Second) // a poll is in flight, and hangs
	w.srv.SetFaults(cloudmaplocal.Faults{})
	key := registry.Key{Namespace: "ours", Name: "svc-3"}
	w.register(t, key, "set", "10.0.0.2")
	changed := time.Now()
	for w.endpoints(key) != 2 {
		if time.Since(changed) > 40*time.Second {
			t.Fatal("a change after a hung call was never read: the feed stalled")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a change made as a hung call's connection still hung was read after %v", time.Since(changed).Round(time.Millisecond))
}

// A burst of foreign changes costs one catch-up (a listing and a revision
// per known service) rather than a GetOperation per operation.
func TestBurstOfForeignChangesIsCaughtUp(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 100, 0)
	w.start(t)
	before := w.calls.Snapshot()
	burst := time.Now()
	for i := 0; i < 100; i++ {
		w.register(t, registry.Key{Namespace: "ours", Name: fmt.Sprintf("svc-%d", i)}, "set", "10.0.1.1")
	}
	// An operation still running at a catch-up may be found only by the
	// sweep OperationWait + ReadLag (15 s) after it, then read.
	deadline := time.Now().Add(40 * time.Second)
	for i := 0; i < 100; i++ {
		for w.endpoints(registry.Key{Namespace: "ours", Name: fmt.Sprintf("svc-%d", i)}) != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("svc-%d: the burst was not read", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	got := diff(before, w.calls.Snapshot())
	// Lookups stay within their budget (20 at once, 5/s) for as long as
	// the burst took to read, fewer than the changes, and a catch-up
	// (a listing) reads the rest. The time is measured: a loaded machine
	// stretches the burst, and the budget with it (43 lookups in 5 s were
	// once counted against a fixed 40).
	o := cloudmap.WatchOptions{}.WithDefaults()
	budget := float64(o.MaxGetOperations) + o.GetOperationRate*time.Since(burst).Seconds()
	if got["GetOperation"] > min(budget, 99) || got["ListServices"] == 0 {
		t.Errorf("%.0f GetOperation calls for 100 foreign changes in %v (budget %.0f), %.0f listings; want a catch-up to read the rest (%v)",
			got["GetOperation"], time.Since(burst).Round(time.Second), budget, got["ListServices"], got)
	}
	t.Logf("calls for 100 foreign changes: %v", got)
}

// A catch-up whose listing is throttled (every importer of a large
// clusterset catching up at once, past the account's ListServices quota)
// is tried again after a backoff, and polls go on meanwhile: a change
// made while it fails is heard, and the burst it was for is read once
// the quota allows. Before, the watcher retried the catch-up at every
// step and never polled (BenchmarkFleet, 50 x 1,000: 11 of 49 importers
// deaf to a change for the 2 minutes measured).
func TestThrottledCatchUpGoesOnPolling(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 120, 0)
	w.start(t)
	w.settle(t)
	// ListServices throttled from now: a token a minute, the first spent
	// here.
	w.srv.SetFaults(cloudmaplocal.Faults{RateLimits: map[string]cloudmaplocal.RateLimit{"ListServices": {Rate: 1.0 / 60, Burst: 1}}})
	if _, err := w.setup.ListServices(context.Background(), &sd.ListServicesInput{}); err != nil {
		t.Fatal(err)
	}
	before := w.calls.Snapshot()
	// Past the lookup budget (20 at once): a catch-up is wanted, and fails.
	for i := 0; i < 100; i++ {
		w.register(t, registry.Key{Namespace: "ours", Name: fmt.Sprintf("svc-%d", i)}, "set", "10.0.1.1")
	}
	time.Sleep(10 * time.Second)
	if diff(before, w.calls.Snapshot())["ListServices"] == 0 {
		t.Fatal("no catch-up was tried: the test throttles nothing")
	}
	later := registry.Key{Namespace: "ours", Name: "svc-110"}
	w.register(t, later, "set", "10.0.2.2")
	changed := time.Now()
	for w.endpoints(later) != 2 {
		if time.Since(changed) > 30*time.Second {
			t.Fatalf("a change made while catch-ups were throttled was not heard in 30 s (calls since the burst: %v)", diff(before, w.calls.Snapshot()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a change made while catch-ups were throttled was heard after %v", time.Since(changed).Round(time.Millisecond))
	w.srv.SetFaults(cloudmaplocal.Faults{})
	lifted := time.Now()
	// The backoff is at most a minute, with the sweeps after the catch-up.
	for i := 0; i < 100; i++ {
		for w.endpoints(registry.Key{Namespace: "ours", Name: fmt.Sprintf("svc-%d", i)}) != 2 {
			if time.Since(lifted) > 2*time.Minute {
				t.Fatalf("svc-%d: the burst was not caught up once the throttling ended", i)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("the burst was caught up %v after the throttling ended", time.Since(lifted).Round(time.Millisecond))
}

// A read that finds an exported service gone is confirmed by a second read
// ConfirmAbsence (5 s) later before the sink hears it: Cloud Map's reads
// are eventually consistent, and one stale answer must not remove imports.
func TestAbsenceIsConfirmedBeforeImportsGo(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 3, 0)
	w.start(t)
	key := registry.Key{Namespace: "ours", Name: "svc-1"}
	if w.endpoints(key) != 1 {
		t.Fatalf("%s not heard after the sync", key)
	}
	if _, err := w.setup.DeregisterInstance(context.Background(), &sd.DeregisterInstanceInput{ServiceId: aws.String(w.svcs[key]), InstanceId: aws.String("i-10.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	for w.heardOf(key) {
		if time.Since(gone) > 20*time.Second {
			t.Fatal("the unexport was never heard")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(gone); d < 5*time.Second {
		t.Errorf("the sink heard %s gone %v after the deregistration; want a second read at least 5 s after the first", key, d)
	}
}

// heardOf says whether the sink's last word on key was an export.
func (w *watched) heardOf(key registry.Key) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.heard[key]) > 0
}

// A namespace's ServiceCount lags behind its services: a watcher (re)started
// while it says 0 still finds every service, and a listing then takes none
// of them for gone.
func TestServiceCountIsNotTrusted(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 5, 0)
	w.srv.SetFaults(cloudmaplocal.Faults{StaleServiceCounts: true})
	w.start(t)
	for i := 0; i < 5; i++ {
		if key := (registry.Key{Namespace: "ours", Name: fmt.Sprintf("svc-%d", i)}); w.endpoints(key) != 1 {
			t.Errorf("%s not found after the first sync", key)
		}
	}
}

// Operations on services outside the MCS namespaces (DNS registrations, as
// --cloudmap-dns makes) cost a GetOperation each: the service and its
// namespace are looked up once, not on every operation.
func TestDNSRegistrationsAreLookedUpOnce(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 1, 0)
	w.start(t)
	ctx := context.Background()
	nsID := cloudmaptest.DNSNamespace(t, w.setup, "dns.local", "vpc-1")
	var ids []string
	for i := range 3 {
		s, err := w.setup.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(fmt.Sprintf("web-%d", i)), NamespaceId: aws.String(nsID),
			DnsConfig: &types.DnsConfig{DnsRecords: []types.DnsRecord{{Type: types.RecordTypeA, TTL: aws.Int64(10)}}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, aws.ToString(s.Service.Id))
	}
	w.settle(t)
	before := w.calls.Snapshot()
	// 12 operations, slower than the lookup budget (5/s) so that each is
	// attributed rather than caught up.
	last := map[string]*string{}
	for round := range 4 {
		for _, id := range ids {
			if last[id] != nil { // a write while the last one runs would be a DuplicateRequest
				if _, err := cloudmapclient.WaitOperation(ctx, w.setup, last[id]); err != nil {
					t.Fatal(err)
				}
			}
			out, err := w.setup.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(id), InstanceId: aws.String("pod"),
				Attributes: map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprintf("10.1.0.%d", round+1)}})
			if err != nil {
				t.Fatal(err)
			}
			last[id] = out.OperationId
			time.Sleep(300 * time.Millisecond)
		}
	}
	// The last ones finish up to an operation's time later, unseen by a
	// settle that began before.
	for _, op := range last {
		if _, err := cloudmapclient.WaitOperation(ctx, w.setup, op); err != nil {
			t.Fatal(err)
		}
	}
	// Each is attributed by a poll after it ended: the settle below waits
	// for the polls to go quiet, and a loaded machine can space them past
	// its 2 s (11 of 12 were looked up when it returned, once in CI).
	for start := time.Now(); diff(before, w.calls.Snapshot())["GetOperation"] < 12; time.Sleep(100 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%v: the watcher did not attribute the 12 operations in 30 s", diff(before, w.calls.Snapshot()))
		}
	}
	w.settle(t)
	got := diff(before, w.calls.Snapshot())
	if got["GetService"] > 3 || got["GetNamespace"] > 1 {
		t.Errorf("%v: want one GetService per DNS service (3) and one GetNamespace (1)", got)
	}
	t.Logf("calls for 12 operations on 3 DNS services: %v", got)
}

// An export read from Cloud Map carries the Region of the registry that
// holds it (each cluster exports to its own Region's): local-first routing
// prefers the same Region before another.
func TestExportsCarryTheirRegion(t *testing.T) {
	t.Parallel()
	w := newWatched(t, 1, 0)
	w.start(t)
	region := w.setup.Options().Region
	w.mu.Lock()
	defer w.mu.Unlock()
	exports := w.heard[registry.Key{Namespace: "ours", Name: "svc-0"}]
	if len(exports) != 1 || region == "" || exports[0].Region != region {
		t.Fatalf("exports %+v, want one from Region %q", exports, region)
	}
}
