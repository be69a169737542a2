package cloudmap

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
)

// The change record round-trips through its attributes, within Cloud
// Map's limits, and tells a reader what changed since its last read or
// that it must catch up.
func TestChangeRecord(t *testing.T) {
	key := func(i int) registry.Key { return registry.Key{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)} }
	l := newChangeLog()
	for i := 1; i <= 5; i++ {
		l.note(key(i))
	}
	l.note(key(2)) // seq 6: key 2 once, at its latest
	attrs, due := l.due(time.Now(), MinHeartbeat, "c1", "set")
	if !due {
		t.Fatal("unsent changes are not due")
	}
	l.sent(time.Now())
	if _, again := l.due(time.Now(), MinHeartbeat, "c1", "set"); again {
		t.Fatal("a sent record is due again before its heartbeat")
	}
	r, ok := parseRecord(attrs)
	if !ok || r.seq != 6 || r.oldest != 1 || len(r.changes) != 5 {
		t.Fatalf("parsed %+v (ok %v), want seq 6, oldest 1, 5 changes", r, ok)
	}
	names := func(keys []registry.Key) []string {
		var out []string
		for _, k := range keys {
			out = append(out, k.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		epoch    string
		seq      int64
		want     []string
		complete bool
	}{
		{r.epoch, 6, nil, true},                        // nothing new
		{r.epoch, 4, []string{"svc-2", "svc-5"}, true}, // since 4
		{r.epoch, 0, []string{"svc-1", "svc-2", "svc-3", "svc-4", "svc-5"}, true},
		{"", 0, []string{"svc-1", "svc-2", "svc-3", "svc-4", "svc-5"}, true}, // a new writer whose slots hold everything
	} {
		keys, complete := r.since(c.epoch, c.seq)
		if complete != c.complete || !slices.Equal(names(keys), c.want) {
			t.Errorf("since(%q, %d) = %v, %v; want %v, %v", c.epoch, c.seq, names(keys), complete, c.want, c.complete)
		}
	}

	// More changes than slots: a reader behind the oldest slot catches up.
	for i := 10; i < 10+changeSlots+5; i++ {
		l.note(key(i))
	}
	attrs, _ = l.due(time.Now(), MinHeartbeat, "c1", "set")
	total := 0
	for k, v := range attrs {
		total += len(k) + len(v)
	}
	if len(attrs) > 30 || total > 5000 {
		t.Fatalf("%d custom attributes, %d characters: over Cloud Map's 30 and 5,000", len(attrs), total)
	}
	r, _ = parseRecord(attrs)
	if _, complete := r.since(r.epoch, 6); complete {
		t.Error("a reader behind the oldest slot was not told to catch up")
	}
	if keys, complete := r.since(r.epoch, r.seq-1); !complete || len(keys) != 1 {
		t.Errorf("a reader one change behind: %v, %v", keys, complete)
	}
	if _, complete := r.since("older-epoch", 3); complete {
		t.Error("a restarted writer whose first changes are gone did not ask for a catch-up")
	}
}
