//go:build e2e

package cloudmap_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// noLateFailures is Cloud Map as documented but for operations failing
// after they were accepted: for tests of raw backends, which have no
// export reconciler to write a failed write again (that path is
// TestLateFailureIsWrittenAgain's, and the e2e tests').
func noLateFailures() *cloudmaplocal.Profile {
	p := cloudmaplocal.AWS()
	p.LateFailureRate = 0
	return &p
}

// pair is an exporter and an importer of clusterset "set", each the
// controller's registry side at the shipped defaults with its watch
// running, on one emulator.
type pair struct {
	srv                *cloudmaptest.Emulator
	exporter, importer *cloudmap.Backend
	calls              *cloudmapclient.Calls // the importer's
	pages              []int                 // the importer's polls
	failures           chan registry.Key     // the exporter's OnWriteFailed

	mu    sync.Mutex
	heard map[registry.Key][]registry.Export
}

func newPair(t *testing.T, p cloudmaplocal.Profile) *pair {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &pair{srv: cloudmaptest.Start(t, cloudmaplocal.Options{Profile: &p}), calls: &cloudmapclient.Calls{},
		heard: map[registry.Key][]registry.Export{}, failures: make(chan registry.Key, 100)}
	exp := w.srv.Client(t, w.srv.Shipped())
	w.exporter = cloudmap.New(exp, cloudmap.Options{ClusterSet: "set", Cluster: "c1", Controller: "test", Log: logr.Discard(),
		Observer: registry.ObserverFuncs{OnWriteFailed: func(key registry.Key) { w.failures <- key }}})
	co := w.srv.Shipped()
	co.OnCall = w.calls.Record
	w.importer = cloudmap.New(w.srv.Client(t, co), cloudmap.Options{ClusterSet: "set", Cluster: "c2", Controller: "test", Log: logr.Discard(),
		Observer: registry.ObserverFuncs{OnPollPages: func(n int) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.pages = append(w.pages, n)
		}}})
	synced := make(chan struct{})
	go func() { _ = w.exporter.Watch(ctx, registry.SinkFuncs{}) }()
	go func() {
		_ = w.importer.Watch(ctx, registry.SinkFuncs{
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
	case <-time.After(time.Minute):
		t.Fatal("the importer did not sync")
	}
	return w
}

// imports tells whether the importer's last word on key is c1's export of ip.
func (w *pair) imports(key registry.Key, ip string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.heard[key] {
		if e.Cluster == "c1" && len(e.Endpoints) == 1 && e.Endpoints[0].IP == ip {
			return true
		}
	}
	return false
}

// publish publishes as the export reconciler does while a write of the
// record still runs: again a second later, for up to a minute.
func (w *pair) publish(t *testing.T, e registry.Export) error {
	t.Helper()
	return publish(context.Background(), w.exporter, e)
}

func publish(ctx context.Context, r registry.Registry, e registry.Export) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := r.Publish(ctx, e)
		if !errors.Is(err, registry.ErrPending) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// withdrawn withdraws as the export reconciler does while the withdrawal
// is pending: again a second later, until it is done, for up to within.
func withdrawn(t *testing.T, r registry.Registry, key registry.Key, within time.Duration) {
	t.Helper()
	start := time.Now()
	for err := r.Withdraw(context.Background(), key); err != nil; err = r.Withdraw(context.Background(), key) {
		if !errors.Is(err, registry.ErrPending) || time.Since(start) > within {
			t.Fatalf("withdrawing %s: %v", key, err)
		}
		time.Sleep(time.Second)
	}
}

// The data plane trails a write by up to 4 s, longer than the 1.5 s poll:
// a read right after the change feed shows an operation is often stale.
// Each change still arrives, because a changed service is read until a
// read shows it.
func TestStaleReadIsReadAgain(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.ReadLag = 4 * time.Second
	p.TenantOperations = 0 // the change feed is not what is tested
	p.LateFailureRate = 0
	w := newPair(t, p)
	key := registry.Key{Namespace: "demo", Name: "web"}
	for i := range 3 {
		ip := fmt.Sprintf("10.0.0.%d", i+1)
		if err := w.publish(t, export("c1", key, ip)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for !w.imports(key, ip) {
			if time.Since(start) > 20*time.Second {
				t.Fatalf("change %d (to %s) never arrived: a stale read was taken as the service's state", i+1, ip)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("change %d arrived after %v", i+1, time.Since(start).Round(time.Millisecond))
	}
}

// settledPair is a pair under the AWS profile with no late failures but
// the ones a test makes, whose namespace exists and is imported (its
// creation is an operation too), every write of it done.
func settledPair(t *testing.T) *pair {
	t.Helper()
	p := cloudmaplocal.AWS()
	p.LateFailureRate = 0
	w := newPair(t, p)
	first := registry.Key{Namespace: "demo", Name: "first"}
	if err := w.publish(t, export("c1", first, "10.0.1.9")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the first export imported", func() bool { return w.imports(first, "10.0.1.9") })
	time.Sleep(5 * time.Second) // its last writes (the service record goes last) done: the profile's longest operation is 4 s
	return w
}

// A write of the exporter's that Cloud Map accepts and then fails is
// reported (WriteFailure, OnWriteFailed), written again by the next
// publish, and the report clears once a write succeeds: the importer gets
// the export.
func TestLateFailureIsWrittenAgain(t *testing.T) {
	t.Parallel()
	w := settledPair(t)
	key := registry.Key{Namespace: "demo", Name: "api"}
	w.srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	// Accepted: the call returns (or asks to be made again while the
	// records it would replace wait for it).
	if err := w.exporter.Publish(context.Background(), export("c1", key, "10.0.1.1")); err != nil && !errors.Is(err, registry.ErrPending) {
		t.Fatal(err)
	}
	reported(t, w.failures, key, 30*time.Second)
	var late *registry.LateFailureError
	if err := w.exporter.WriteFailure(key); !errors.As(err, &late) {
		t.Fatalf("WriteFailure after a failed write: %v", err)
	}
	w.srv.SetFaults(cloudmaplocal.Faults{})
	// As the export reconciler does: publish again while the failure stands.
	start := time.Now()
	for err := w.publish(t, export("c1", key, "10.0.1.1")); err != nil; err = w.publish(t, export("c1", key, "10.0.1.1")) {
		if !errors.As(err, &late) {
			t.Fatal(err)
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("the failure was never made good: %v", err)
		}
		time.Sleep(time.Second)
	}
	for !w.imports(key, "10.0.1.1") {
		if time.Since(start) > time.Minute {
			t.Fatal("the export written again never reached the importer")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// In one account the change feed tells the exporter how its writes
// ended; when its polls miss one (refused here; paged past in a busy
// account during a bulk export), the exporter asks GetOperation once the
// operation has gone unseen for a while, so a write that failed late is
// reported and written again in seconds. Before, it waited for the feed
// to give the operation up, after 100 s.
func TestUnseenOwnOperationIsAskedAbout(t *testing.T) {
	t.Parallel()
	w := settledPair(t)
	// Every poll refused (a quota of one call an hour), every write failed.
	w.srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1, RateLimits: map[string]cloudmaplocal.RateLimit{"ListOperations": {Rate: 1.0 / 3600, Burst: 1}}})
	key := registry.Key{Namespace: "demo", Name: "api"}
	start := time.Now()
	if err := w.exporter.Publish(context.Background(), export("c1", key, "10.0.1.1")); err != nil && !errors.Is(err, registry.ErrPending) {
		t.Fatal(err)
	}
	reported(t, w.failures, key, 40*time.Second)
	t.Logf("the late failure, unseen by the feed, reported after %v", time.Since(start).Round(100*time.Millisecond))
	var late *registry.LateFailureError
	if err := w.exporter.WriteFailure(key); !errors.As(err, &late) {
		t.Errorf("WriteFailure after a failed write no poll saw: %v", err)
	}
}

// Deleting the namespace a withdrawal emptied is an operation too, and
// can fail after Cloud Map accepted it: the withdrawal stays pending, and
// asks again, until the namespace is gone. Before, it returned at once,
// and the namespace stayed for good, its last service gone with the
// withdrawal's way back to it.
func TestFailedNamespaceDeletionIsMadeAgain(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.LateFailureRate = 0 // the test fails the operations it means to
	w := newPair(t, p)
	setup := w.srv.Client(t, w.srv.Shipped())
	ctx := context.Background()
	key := registry.Key{Namespace: "gone", Name: "api"}
	if err := w.publish(t, export("c1", key, "10.0.2.1")); err != nil {
		t.Fatal(err)
	}
	nss, err := setup.ListNamespaces(ctx, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Values: []string{key.Namespace}}}})
	if err != nil || len(nss.Namespaces) != 1 {
		t.Fatalf("namespace %s: %v %v", key.Namespace, nss, err)
	}
	nsID := aws.ToString(nss.Namespaces[0].Id)
	instances := func() int32 {
		out, err := setup.ListServices(ctx, &sd.ListServicesInput{Filters: []types.ServiceFilter{{Name: types.ServiceFilterNameNamespaceId, Values: []string{nsID}}}})
		if err != nil || len(out.Services) != 1 {
			t.Fatalf("the service of %s: %v %v", key, out, err)
		}
		return aws.ToInt32(out.Services[0].InstanceCount)
	}
	waitUntil(t, "the export written whole", func() bool { return instances() > 0 })
	time.Sleep(5 * time.Second) // its writes done: the profile's longest operation is 4 s
	// Its records deregistered (for real), the service emptied.
	if err := w.exporter.Withdraw(ctx, key); !errors.Is(err, registry.ErrPending) {
		t.Fatalf("a withdrawal that deregisters: %v, want pending", err)
	}
	waitUntil(t, "the records deregistered", func() bool { return instances() == 0 })
	w.srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	nsLeft := func() bool {
		_, err := setup.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(nsID)})
		if err != nil && !cloudmapclient.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	// The service goes, the namespace's deletion is accepted, and fails:
	// the withdrawal is not done while the namespace is there.
	for range 8 {
		if err := w.exporter.Withdraw(ctx, key); !errors.Is(err, registry.ErrPending) {
			t.Fatalf("a withdrawal whose namespace deletion fails: %v (namespace there: %v), want pending", err, nsLeft())
		}
		time.Sleep(time.Second)
	}
	if !nsLeft() {
		t.Fatal("the namespace was deleted although every operation fails")
	}
	w.srv.SetFaults(cloudmaplocal.Faults{})
	withdrawn(t, w.exporter, key, 30*time.Second)
	if nsLeft() {
		t.Fatal("the withdrawal finished and its emptied namespace is still there")
	}
}

// Across accounts no operation of the member's is listed to it: a write
// Cloud Map accepts and then fails is still reported within seconds
// (GetOperation), and written again, the change record included (without
// it no other account hears of the change): the owner's cluster gets the
// member's change.
func TestLateFailureAcrossAccountsIsWrittenAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := accountsEmulator(t) // no late failures but the ones the test makes
	east := newMember(t, ctx, srv, "AKIDOWNER", ownerAccount, "east")
	west := newMember(t, ctx, srv, "AKIDMEMBER", memberAccount, "west")
	web := registry.Key{Namespace: "apps", Name: "web"}
	if err := publish(ctx, east.b, export("east", registry.Key{Namespace: "apps", Name: "api"}, "10.1.0.1")); err != nil {
		t.Fatal(err)
	}
	shareWithMember(t, srv, east)
	waitUntil(t, "the member's export is published", func() bool {
		return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil
	})
	waitUntil(t, "the owner's cluster imports it", func() bool { return slices.Contains(east.ips(web), "10.2.0.1") })
	time.Sleep(5 * time.Second) // every write of it done: the profile's longest operation is 4 s

	// The change record: a publish with nothing new to write still
	// announces the export; that write fails, and goes again by itself.
	before := changeSeq(t, west)
	srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	if err := west.b.Publish(ctx, export("west", web, "10.2.0.1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the record's write failed
	srv.SetFaults(cloudmaplocal.Faults{})
	waitUntil(t, "the member's change record written again", func() bool { return changeSeq(t, west) > before })

	// The export's records.
	srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	if err := west.b.Publish(ctx, export("west", web, "10.2.0.2")); err != nil && !errors.Is(err, registry.ErrPending) {
		t.Fatal(err)
	}
	reported(t, west.failures, web, 15*time.Second)
	srv.SetFaults(cloudmaplocal.Faults{})
	// As the export reconciler does: publish again while the failure stands.
	var late *registry.LateFailureError
	waitUntil(t, "the failed write made good", func() bool {
		err := publish(ctx, west.b, export("west", web, "10.2.0.2"))
		if err != nil && !errors.As(err, &late) {
			t.Fatal(err)
		}
		return err == nil
	})
	waitUntil(t, "the owner's cluster imports the change", func() bool { return slices.Contains(east.ips(web), "10.2.0.2") })
}

// changeSeq is the sequence number m's change record shows (0: none).
func changeSeq(t *testing.T, m *member) int {
	t.Helper()
	out, err := m.c.DiscoverInstances(context.Background(), &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(cloudmap.ChangesNamespace("set")), ServiceName: aws.String(cloudmap.ChangesService),
		OwnerAccount: aws.String(ownerAccount), HealthStatus: types.HealthStatusFilterAll,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range out.Instances {
		if aws.ToString(in.InstanceId) == m.b.Cluster() {
			n, _ := strconv.Atoi(in.Attributes["seq"]) // the record's sequence attribute (changerecord.go)
			return n
		}
	}
	return 0
}

// reported waits for a late failure to be reported (OnWriteFailed), of key.
func reported(t *testing.T, failures <-chan registry.Key, key registry.Key, within time.Duration) {
	t.Helper()
	select {
	case k := <-failures:
		if k != key {
			t.Fatalf("a late failure reported for %s, want %s", k, key)
		}
	case <-time.After(within):
		t.Fatalf("%s: a write failed after it was accepted and nobody was told within %v", key, within)
	}
}

// In an account busy with other tools' operations (20 a second here,
// twenty times the profile's default), a poll pages only through what is
// new, within its budget of 5 pages, and a change still arrives. An
// account's operations are all paged before filtering, so a poll that
// read until the filter ran out would read every page Cloud Map keeps.
func TestBusyAccountPagedWithinBudget(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.TenantOperations = 20
	p.LateFailureRate = 0 // tested apart: here the one change must happen
	w := newPair(t, p)
	time.Sleep(15 * time.Second) // 300 operations of others, and polls through them
	key := registry.Key{Namespace: "demo", Name: "busy"}
	before := w.calls.Snapshot()["ListOperations"]
	w.mu.Lock()
	polls := len(w.pages)
	w.mu.Unlock()
	if err := w.publish(t, export("c1", key, "10.0.2.1")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !w.imports(key, "10.0.2.1") {
		if time.Since(start) > 30*time.Second {
			t.Fatal("a change in a busy account never arrived")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(10 * time.Second)
	w.mu.Lock()
	defer w.mu.Unlock()
	most, sum := 0, 0
	for _, n := range w.pages[polls:] {
		most, sum = max(most, n), sum+n
	}
	n := len(w.pages) - polls
	calls := w.calls.Snapshot()["ListOperations"] - before
	t.Logf("%d polls, %d pages (%.1f a poll, at most %d), %.0f ListOperations calls; the change arrived after %v",
		n, sum, float64(sum)/float64(n), most, calls, time.Since(start).Round(time.Millisecond))
	if most > 5 {
		t.Errorf("a poll read %d pages, past the budget of 5", most)
	}
	if calls > float64(sum)+float64(n) { // a page's retry at most once a poll
		t.Errorf("%.0f ListOperations calls for %d pages", calls, sum)
	}
	if avg := float64(sum) / float64(n); avg > 4 {
		t.Errorf("%.1f pages a poll at 20 operations a second: want about 1 + 11.5 x 20 / 100", avg)
	}
}

// An idle importer polls at PollInterval, in an account where other
// tenants write all the time (the profile's one operation a second) and
// exporters rewrite their heartbeats: neither is a change of the
// clusterset's. Before, any operation of another's made the next polls
// fast (FastInterval), so an idle clusterset polled five times as often
// as it says, and a large one held the account's ListOperations at the
// 40 calls a second all its clusters may make together.
func TestIdleAmongOthersWritesPollsSlowly(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.LateFailureRate = 0 // the one export must be written
	w := newPair(t, p)
	key := registry.Key{Namespace: "demo", Name: "idle"}
	if err := w.publish(t, export("c1", key, "10.0.3.1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the export imported", func() bool { return w.imports(key, "10.0.3.1") })
	time.Sleep(10 * time.Second) // past the burst's fast polls (ActiveWindow 5 s)
	const window = 15 * time.Second
	before := w.calls.Snapshot()["ListOperations"]
	time.Sleep(window)
	polls := w.calls.Snapshot()["ListOperations"] - before
	o := cloudmap.WatchOptions{}.WithDefaults()
	most := window.Seconds()/o.PollInterval.Seconds() + 2 // a poll's page retried, a step's own time
	t.Logf("%.0f ListOperations calls in %v of idle among %v other operations a second", polls, window, p.TenantOperations)
	if polls > most {
		t.Errorf("%.0f ListOperations calls in %v idle, want at most %.0f (one a %v poll)", polls, window, most, o.PollInterval)
	}
}

// An importer started right after changes (a controller restart, a new
// cluster joining) reads them all: its first reads may trail them by the
// read lag, so it compares the revisions again after it, as after a
// catch-up. Before, such a stale first read (the service not there yet)
// stood until the next change or the 6-hour sweep.
func TestStartRightAfterChangesReadsThem(t *testing.T) {
	t.Parallel()
	p := cloudmaplocal.AWS()
	p.ReadLag = 5 * time.Second // the watcher's --cloudmap-read-lag: the longest it covers
	p.TenantOperations, p.LateFailureRate = 0, 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: &p})
	exporter := cloudmap.New(srv.Client(t, srv.Shipped()), cloudmap.Options{ClusterSet: "set", Cluster: "c1", Controller: "test", Log: logr.Discard()})
	setup := srv.Client(t, cloudmapclient.Options{})
	var keys []registry.Key
	for i := range 5 {
		key := registry.Key{Namespace: "demo", Name: fmt.Sprintf("web-%d", i)}
		keys = append(keys, key)
		if err := publish(ctx, exporter, export("c1", key, "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "every first write done", func() bool {
		for _, k := range keys {
			if instancesOf(ctx, setup, k) == 0 {
				return false
			}
		}
		return true
	})
	// Past the read lag, every read shows 10.0.0.1; then each service
	// changes to 10.0.0.2, and as soon as Cloud Map says every change is
	// done, a new importer starts.
	time.Sleep(p.ReadLag)
	for _, k := range keys {
		if err := publish(ctx, exporter, export("c1", k, "10.0.0.2")); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "every change done", func() bool {
		for _, k := range keys {
			if ipsOf(ctx, setup, k) != "10.0.0.2" {
				return false
			}
		}
		return true
	})
	var mu sync.Mutex
	heard := map[registry.Key]bool{}
	importer := cloudmap.New(srv.Client(t, srv.Shipped()), cloudmap.Options{ClusterSet: "set", Cluster: "c2", Controller: "test", Log: logr.Discard()})
	go func() {
		_ = importer.Watch(ctx, registry.SinkFuncs{OnSet: func(key registry.Key, e []registry.Export) {
			mu.Lock()
			defer mu.Unlock()
			heard[key] = len(e) == 1 && len(e[0].Endpoints) == 1 && e[0].Endpoints[0].IP == "10.0.0.2"
		}})
	}()
	start := time.Now()
	waitUntil(t, "every change read by the new importer", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if !heard[k] {
				return false
			}
		}
		return true
	})
	t.Logf("every change read %v after the importer started", time.Since(start).Round(time.Millisecond))
}

// ipsOf is the addresses c1's records of key hold, as finished operations
// wrote them, space-separated.
func ipsOf(ctx context.Context, c *sd.Client, key registry.Key) string {
	var ips []string
	for _, e := range recordfmt.Decode(key, listed(ctx, c, key)) {
		for _, ep := range e.Endpoints {
			ips = append(ips, ep.IP)
		}
	}
	return strings.Join(ips, " ")
}

// A withdrawal right after an export: a record's registration finished a
// moment before its deregistration was accepted, and a data-plane read
// does not show it yet while the deregistration runs. The withdrawal is
// done only once the service and its namespace are gone. Reads lag five
// minutes here, not the profile's 2 s (Cloud Map promises no bound), so
// that most reads show the service before its records were written: at
// 2 s the race is rarer, not gone (TestRecordGoesWithTheLastExport lost
// it in a clean-clone run).
func TestWithdrawalRightAfterTheExportLeavesNothing(t *testing.T) {
	t.Parallel()
	p := *noLateFailures()
	p.ReadLag = 5 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: &p})
	east := newCluster(t, ctx, srv, "AKIDEAST", "", "", "east")
	key := registry.Key{Namespace: "brief", Name: "web"}
	if err := east.b.Publish(ctx, export("east", key, "10.1.0.1")); err != nil && !errors.Is(err, registry.ErrPending) {
		t.Fatal(err)
	}
	withdrawn(t, east.b, key, time.Minute)
	setup := srv.Client(t, srv.Shipped())
	nss, err := setup.ListNamespaces(ctx, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Values: []string{key.Namespace}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Namespaces {
		svcs, err := setup.ListServices(ctx, &sd.ListServicesInput{Filters: []types.ServiceFilter{{Name: types.ServiceFilterNameNamespaceId, Values: []string{aws.ToString(ns.Id)}}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs.Services {
			t.Errorf("withdrawn, yet service %s is left with %d instances", aws.ToString(s.Name), aws.ToInt32(s.InstanceCount))
		}
		t.Errorf("withdrawn, yet namespace %s is left", aws.ToString(ns.Name))
	}
}
