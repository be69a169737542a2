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
	c := cloudmaptest.ClientOf(t, srv.URL, cloudmapclient.Options{})
	var again []registry.Key
	b := New(c, Options{Cluster: "c1", ClusterSet: "set", Log: logr.Discard(), Observer: registry.ObserverFuncs{OnWriteFailed: func(k registry.Key) { again = append(again, k) }}})
	f := newWatcher(b, registry.SinkFuncs{}).feed.(*operationsFeed)
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
	start := time.Unix(10_000, 0)
	f.clock.Now = start
	if _, err := f.baseline(ctx); err != nil {
		t.Fatal(err)
	}
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
	c := cloudmaptest.ClientOf(t, srv.URL, cloudmapclient.Options{})
	for _, records := range []bool{false, true} {
		b := New(c, Options{Cluster: "c1", ClusterSet: "set", Log: logr.Discard()})
		f := newWatcher(b, registry.SinkFuncs{}).feed.(*operationsFeed)
		start := time.Unix(10_000, 0)
		f.clock.Now = start
		if _, err := f.baseline(ctx); err != nil {
			t.Fatal(err)
		}
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
	b := New(cloudmaptest.ClientOf(t, srv.URL, cloudmapclient.Options{}), Options{Cluster: "c1", ClusterSet: "set", Log: logr.Discard()})
	f := newWatcher(b, registry.SinkFuncs{}).feed.(*operationsFeed)
	start := time.Unix(10_000, 0)
	f.clock.Now = start
	if _, err := f.baseline(ctx); err != nil {
		t.Fatal(err)
	}
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
