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

	// More changes than single slots: the older ones are packed, and a
	// reader behind the single slots reads them all without a catch-up;
	// a reader of the single slots only (a release before the packed
	// ones) is told to catch up, as it was.
	for i := 10; i < 10+changeSlots+5; i++ {
		l.note(key(i))
	}
	attrs, _ = l.due(time.Now(), MinHeartbeat, "c1", "set")
	withinLimits(t, attrs)
	r, _ = parseRecord(attrs)
	if keys, complete := r.since(r.epoch, 6); !complete || len(keys) != changeSlots+5 {
		t.Errorf("a reader %d changes behind: %d keys, complete %v; want all of them", changeSlots+5, len(keys), complete)
	}
	if keys, complete := r.since(r.epoch, r.seq-1); !complete || len(keys) != 1 {
		t.Errorf("a reader one change behind: %v, %v", keys, complete)
	}
	singles := map[string]string{}
	for k, v := range attrs {
		if k[0] != 'o' {
			singles[k] = v
		}
	}
	legacy, _ := parseRecord(singles)
	if _, complete := legacy.since(r.epoch, 6); complete {
		t.Error("a reader of the single slots only, behind them, was not told to catch up")
	}
	if keys, complete := r.since("older-epoch", 3); !complete || len(keys) != 5+changeSlots+5 {
		t.Errorf("a restarted writer whose changes all fit: %d keys, complete %v; want all %d", len(keys), complete, 5+changeSlots+5)
	}

	// A minute on (the heartbeat's write), the older changes are gone
	// from the record: every importer reads the records at every beat.
	later, _ := l.due(time.Now().Add(packedFor+time.Second), time.Second, "c1", "set")
	r, _ = parseRecord(later)
	if len(r.changes) != changeSlots {
		t.Errorf("a record written %v after its changes holds %d, want the %d single slots", packedFor, len(r.changes), changeSlots)
	}
	if _, complete := r.since(r.epoch, 6); complete {
		t.Error("a reader behind the single slots of a record past packedFor was not told to catch up")
	}

	// Changes past what fits: the longest names Kubernetes allows fill
	// Cloud Map's limits; a reader behind what fits catches up, one
	// within it reads every key it missed.
	long := func(i int) registry.Key {
		return registry.Key{Namespace: fmt.Sprintf("%063d", i), Name: fmt.Sprintf("n%062d", i)}
	}
	l = newChangeLog()
	for i := range maxRecent + 10 {
		l.note(long(i))
	}
	attrs, _ = l.due(time.Now(), MinHeartbeat, "c1", "set")
	withinLimits(t, attrs)
	r, _ = parseRecord(attrs)
	if len(r.changes) <= changeSlots {
		t.Errorf("%d changes of the longest names packed, want more than the %d single slots", len(r.changes), changeSlots)
	}
	if _, complete := r.since(r.epoch, r.oldest-2); complete {
		t.Error("a reader behind everything that fits was not told to catch up")
	}
	if _, complete := r.since("older-epoch", 3); complete {
		t.Error("a restarted writer whose first changes are gone did not ask for a catch-up")
	}
	keys, complete := r.since(r.epoch, r.oldest-1)
	if !complete || len(keys) != int(r.seq-r.oldest+1) {
		t.Errorf("a reader just within the record: %d keys, complete %v; want %d", len(keys), complete, r.seq-r.oldest+1)
	}

	// A record of a release before the packed slots: 24 single ones.
	old := map[string]string{attrEpoch: "e", attrSeq: "30"}
	for i := range legacySlots {
		old[fmt.Sprintf("c%02d", i)] = fmt.Sprintf("%d ns/svc-%d", 7+i, i)
	}
	r, _ = parseRecord(old)
	if keys, complete := r.since("e", 6); !complete || len(keys) != legacySlots {
		t.Errorf("an older release's record: %d keys, complete %v; want all %d", len(keys), complete, legacySlots)
	}
}

// withinLimits fails t when attrs pass Cloud Map's limits on an
// instance's attributes.
func withinLimits(t *testing.T, attrs map[string]string) {
	t.Helper()
	total := 0
	for k, v := range attrs {
		total += len(k) + len(v)
		if len(v) > valueChars {
			t.Errorf("attribute %s has %d characters, over Cloud Map's %d", k, len(v), valueChars)
		}
	}
	if len(attrs) > 30 || total > recordChars {
		t.Fatalf("%d custom attributes, %d characters: over Cloud Map's 30 and %d", len(attrs), total, recordChars)
	}
}
