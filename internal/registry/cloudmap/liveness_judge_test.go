package cloudmap

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/registry"
)

// Drained only on positive knowledge: a cluster silent past the TTL while
// another proves alive; never this cluster, never all at once, restored
// on its next proof or when its record goes.
func TestLivenessJudge(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	l := newLiveness("self", ttl)
	old, fresh := now.Add(-ttl-time.Second), now.Add(-time.Minute)
	l.proofs = map[string]time.Time{"self": fresh, "a": old, "b": fresh}
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || l.silentSince("a") != old {
		t.Fatalf("judge %v, silent %v: want a drained", got, l.silent)
	}
	if got := l.judge(now); len(got) != 0 {
		t.Errorf("judged again: %v changed", got)
	}
	// Every record old (an outage, a clock): nobody drained.
	l.proofs = map[string]time.Time{"self": old, "a": old, "b": old}
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("every proof old: changed %v, silent %v; want a restored, nobody drained", got, l.silent)
	}
	// This cluster is never drained, whatever its record says.
	l.proofs = map[string]time.Time{"self": old, "b": fresh}
	if l.judge(now); len(l.silent) != 0 {
		t.Errorf("silent %v, want nobody (this cluster never)", l.silent)
	}
	// A proof restores; a record gone restores.
	l.proofs = map[string]time.Time{"self": fresh, "a": old}
	l.judge(now)
	l.proofs["a"] = fresh
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's proof: changed %v, silent %v", got, l.silent)
	}
	l.proofs["a"] = old
	l.judge(now)
	delete(l.proofs, "a")
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's record went: changed %v, silent %v", got, l.silent)
	}
	// A negative TTL never drains.
	never := newLiveness("self", -1)
	never.proofs = map[string]time.Time{"self": fresh, "a": old}
	if got := never.judge(now); len(got) != 0 {
		t.Errorf("TTL off: %v drained", got)
	}
}

// A liveness record counts only under its cluster's own instance id: a
// record filed under another id, claiming a cluster that writes none (an
// AWS controller's, say) with an old time, drains nobody, and one claiming
// a drained cluster with a fresh time restores nobody.
func TestMisfiledRecordsProveNothing(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	w := &Watcher{b: &Backend{o: Options{Cluster: "self", ClusterSet: "set", Log: logr.Discard()}}, alive: newLiveness("self", ttl),
		dirty: map[registry.Key]time.Time{}, revisions: map[registry.Key]int64{}, exported: map[registry.Key]bool{}}
	rec := func(id, cluster string, at time.Time) types.HttpInstanceSummary {
		return types.HttpInstanceSummary{InstanceId: aws.String(id), Attributes: map[string]string{
			AttrClusterID: cluster, attrEpoch: "e", attrSeq: "1", attrUpdated: strconv.FormatInt(at.Unix(), 10)}}
	}
	fresh, old := now.Add(-time.Minute), now.Add(-ttl-time.Hour)
	w.proved(now, []types.HttpInstanceSummary{rec("self", "self", fresh), rec("forged", "aws-cluster", old)}, 1)
	if len(w.alive.silent) != 0 || !w.alive.proofs["aws-cluster"].IsZero() {
		t.Errorf("a misfiled old record: silent %v, proofs %v; want nobody drained, no proof", w.alive.silent, w.alive.proofs)
	}
	w.proved(now, []types.HttpInstanceSummary{rec("self", "self", fresh), rec("gone", "gone", old)}, 2)
	if w.alive.silentSince("gone").IsZero() {
		t.Fatalf("gone's own old record did not drain it: %v", w.alive.silent)
	}
	w.proved(now, []types.HttpInstanceSummary{rec("self", "self", fresh), rec("gone", "gone", old), rec("forged", "gone", fresh)}, 3)
	if w.alive.silentSince("gone").IsZero() {
		t.Errorf("a misfiled fresh record restored gone: %v", w.alive.silent)
	}
}

// A cluster that exports nothing, or no longer, has no record due: the
// writer waits (it spun a core on waits of zero in every cluster that
// only imports), and the first export wakes it.
func TestNoRecordDueWaitsForAnExport(t *testing.T) {
	const heartbeat = time.Minute
	l := newChangeLog()
	now := time.Now()
	if _, due := l.due(now, heartbeat, "c1", "set"); due {
		t.Fatal("a record is due before anything is exported")
	}
	if d := l.nextBeat(now, heartbeat); d <= 0 {
		t.Fatalf("with nothing exported the writer waits %v: it would spin", d)
	}
	l.alive()
	select {
	case <-l.wake:
	default:
		t.Fatal("the first export does not wake the writer")
	}
	if _, due := l.due(now, heartbeat, "c1", "set"); !due {
		t.Fatal("no record due after the first export")
	}
	l.sent(now)
	l.retire()
	later := now.Add(2 * heartbeat)
	if _, due := l.due(later, heartbeat, "c1", "set"); due {
		t.Fatal("a record is due after the cluster stopped exporting")
	}
	if d := l.nextBeat(later, heartbeat); d <= 0 {
		t.Fatalf("after its exports ended the writer waits %v: it would spin", d)
	}
}
