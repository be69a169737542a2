package cloudmap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
)

// A poll after a gap in polling (throttled calls, a long catch-up) reads
// past what the poll before it saw end: an operation of this cluster's
// still running then, created before one that poll saw, is read when it
// ends, and its late failure told at once. Before, the poll stopped at the
// operation seen more than Overlap ago by the clock, and the failure waited
// for the net (expireOwnOps) 100 s later: seen in BenchmarkFleet's bulk
// export at 50 x 1,000. Cloud Map's listing is scripted here (newest
// first, finished ones only), for the order of the two operations.
func TestPollAfterAGapReadsWhatEndedInIt(t *testing.T) {
	var mu sync.Mutex
	var listed []map[string]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		switch r.Header.Get("X-Amz-Target") {
		case "Route53AutoNaming_v20170314.ListOperations":
			mu.Lock()
			defer mu.Unlock()
			_ = json.NewEncoder(w).Encode(map[string]any{"Operations": listed})
		case "Route53AutoNaming_v20170314.GetOperation":
			fmt.Fprint(w, `{"Operation":{"Id":"op-old","Status":"FAIL","Type":"REGISTER_INSTANCE","ErrorCode":"INTERNAL_FAILURE","ErrorMessage":"failed late"}}`)
		default:
			http.Error(w, "not scripted", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	var again []registry.Key
	b, f := scriptedFeed(t, srv.URL, Options{Observer: registry.ObserverFuncs{OnWriteFailed: func(k registry.Key) { again = append(again, k) }}})
	poll := func(at time.Time, ops ...map[string]string) {
		t.Helper()
		mu.Lock()
		listed = ops
		mu.Unlock()
		f.clock.Now = at
		if _, err := f.operations(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	older, newer := registry.Key{Namespace: "apps", Name: "web"}, registry.Key{Namespace: "apps", Name: "api"}
	start := f.clock.Now
	b.ownOp(aws.String("op-old"), older)
	b.ownOp(aws.String("op-new"), newer)
	// The newer write ends first; the older one still runs.
	poll(start.Add(1500*time.Millisecond), map[string]string{"Id": "op-new", "Status": "SUCCESS"})
	// 20 s without a poll; the older write failed meanwhile.
	poll(start.Add(21500*time.Millisecond), map[string]string{"Id": "op-new", "Status": "SUCCESS"}, map[string]string{"Id": "op-old", "Status": "FAIL"})
	if !slices.Equal(again, []registry.Key{older}) {
		t.Fatalf("written again after the gap: %v, want %v", again, older)
	}
	if err := b.WriteFailure(older); err == nil {
		t.Error("the late failure is not held against its export")
	}
}

// A poll that pages past MaxPollPages (a bulk export of the clusterset's,
// a busy account) wants a catch-up, unless the change records say what
// changed: the operations then only end this cluster's own writes, and a
// catch-up per poll cost every importer of a 50-cluster fleet a revision
// call per known service, three times, every 3 s of a bulk export.
func TestPagesPastTheBudgetCatchUpOnlyWithoutRecords(t *testing.T) {
	var pages atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if r.Header.Get("X-Amz-Target") != "Route53AutoNaming_v20170314.ListOperations" {
			http.Error(w, "not scripted", http.StatusBadRequest)
			return
		}
		// Endless pages of other tenants' operations, new at every poll.
		n := pages.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"Operations": []map[string]string{{"Id": fmt.Sprintf("op-%d", n), "Status": "SUCCESS"}},
			"NextToken":  fmt.Sprintf("page-%d", n),
		})
	}))
	defer srv.Close()
	ctx := context.Background()
	for _, records := range []bool{false, true} {
		_, f := scriptedFeed(t, srv.URL, Options{})
		start := f.clock.Now
		f.recordsOn = records // as after the records' first read
		f.clock.Now = start.Add(1500 * time.Millisecond)
		if _, err := f.operations(ctx, false); err != nil {
			t.Fatal(err)
		}
		if f.clock.CatchUpWanted == records {
			t.Errorf("with change records %v: a catch-up wanted %v after %d pages, want %v", records, f.clock.CatchUpWanted, f.opts.MaxPollPages, !records)
		}
	}
}

// A catch-up whose listing fails (ListServices throttled) hands the foreign
// operations its baseline took as read back to the polls: a change made
// while catch-ups fail is looked up by the next poll, not left to a
// catch-up that may fail for minutes (TestThrottledCatchUpGoesOnPolling
// failed so, when a retried catch-up came between an operation's end and
// the poll that would have seen it).
func TestFailedCatchUpHandsOperationsBack(t *testing.T) {
	var mu sync.Mutex
	listed := []map[string]string{{"Id": "op-0", "Status": "SUCCESS"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"Operations": listed})
	}))
	defer srv.Close()
	ctx := context.Background()
	_, f := scriptedFeed(t, srv.URL, Options{})
	start := f.clock.Now
	f.clock.Now = start.Add(1500 * time.Millisecond)
	if _, err := f.operations(ctx, false); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	listed = append([]map[string]string{{"Id": "op-1", "Status": "SUCCESS"}}, listed...)
	mu.Unlock()
	// A catch-up's baseline passes op-1; its listing then fails.
	f.clock.Now = start.Add(3 * time.Second)
	undo, err := f.baseline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	undo()
	f.clock.Now = start.Add(4500 * time.Millisecond)
	foreign, err := f.operations(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(foreign, []string{"op-1"}) {
		t.Errorf("the poll after a failed catch-up found %v new, want [op-1]", foreign)
	}
}

// A poll that finds more foreign operations than the lookup budget allows
// wants a catch-up, and still looks up the newest with what the budget
// has left: while catch-ups fail (ListServices throttled), every poll's
// operations were left to them, and a change made meanwhile waited for
// one to succeed (TestThrottledCatchUpGoesOnPolling failed so in a
// clean-clone run: not heard in 30 s).
func TestPollPastTheBudgetLooksUpTheNewest(t *testing.T) {
	const n = 30
	var ops []map[string]string
	for i := n - 1; i >= 0; i-- { // newest first
		ops = append(ops, map[string]string{"Id": fmt.Sprintf("op-%d", i), "Status": "SUCCESS"})
	}
	var listed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		switch r.Header.Get("X-Amz-Target") {
		case "Route53AutoNaming_v20170314.ListOperations":
			if !listed.Swap(true) {
				_ = json.NewEncoder(w).Encode(map[string]any{"Operations": []map[string]string{}}) // the baseline
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"Operations": ops})
		case "Route53AutoNaming_v20170314.GetOperation":
			var in struct{ OperationId string }
			_ = json.NewDecoder(r.Body).Decode(&in)
			_ = json.NewEncoder(w).Encode(map[string]any{"Operation": map[string]any{"Id": in.OperationId, "Status": "SUCCESS",
				"Targets": map[string]string{"SERVICE": "srv-" + in.OperationId[len("op-"):]}}})
		default:
			http.Error(w, "not scripted", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	b, f := scriptedFeed(t, srv.URL, Options{})
	key := func(i int) registry.Key { return registry.Key{Namespace: "apps", Name: fmt.Sprintf("svc-%d", i)} }
	for i := range n {
		b.remember(key(i), fmt.Sprintf("srv-%d", i))
	}
	f.clock.Now = f.clock.Now.Add(1500 * time.Millisecond)
	if err := f.poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !f.clock.CatchUpWanted {
		t.Error("30 foreign operations past a budget of 20: no catch-up wanted")
	}
	for i := range n {
		_, marked := f.dirty[key(i)]
		if want := i >= n-f.opts.MaxGetOperations; marked != want {
			t.Errorf("%s (operation %d of %d, newest last) marked for reading: %v, want %v", key(i), i, n, marked, want)
		}
	}
}

// scriptedFeed is a watcher's operations feed over a scripted Cloud Map at
// url, past its first baseline (at 10,000 s after the epoch).
func scriptedFeed(t *testing.T, url string, o Options) (*Backend, *operationsFeed) {
	t.Helper()
	o.Cluster, o.ClusterSet, o.Log = "c1", "set", logr.Discard()
	b := New(cloudmaptest.ClientOf(t, url, cloudmapclient.Options{}), o)
	f := newWatcher(b, registry.SinkFuncs{}).feed.(*operationsFeed)
	f.clock.Now = time.Unix(10_000, 0)
	if _, err := f.baseline(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b, f
}
