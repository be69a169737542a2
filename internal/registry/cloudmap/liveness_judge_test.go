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
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Drained only on positive knowledge: a cluster silent for the TTL while
// another kept proving alive; never this cluster, never all at once, restored
// on its next proof or when its record goes.
func TestLivenessJudge(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	l := newLiveness("self", ttl)
	old, fresh := now.Add(-ttl-time.Second), now
	l.proofs = map[string]time.Time{"self": fresh, "a": old, "b": fresh}
	if got := l.judge(); !slices.Equal(got, []string{"a"}) || l.silentSince("a") != old {
		t.Fatalf("judge %v, silent %v: want a drained", got, l.silent)
	}
	if got := l.judge(); len(got) != 0 {
		t.Errorf("judged again: %v changed", got)
	}
	// Every record old (an outage, a clock): nobody drained.
	l.proofs = map[string]time.Time{"self": old, "a": old, "b": old}
	if got := l.judge(); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("every proof old: changed %v, silent %v; want a restored, nobody drained", got, l.silent)
	}
	// This cluster is never drained, whatever its record says.
	l.proofs = map[string]time.Time{"self": old, "b": fresh}
	if l.judge(); len(l.silent) != 0 {
		t.Errorf("silent %v, want nobody (this cluster never)", l.silent)
	}
	// A proof restores; a record gone restores.
	l.proofs = map[string]time.Time{"self": fresh, "a": old}
	l.judge()
	l.proofs["a"] = fresh
	if got := l.judge(); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's proof: changed %v, silent %v", got, l.silent)
	}
	l.proofs["a"] = old
	l.judge()
	delete(l.proofs, "a")
	if got := l.judge(); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's record went: changed %v, silent %v", got, l.silent)
	}
	// Every record stopping at once (a registry refusing writes) drains
	// nobody, though one stopped a while before the others and is past
	// the TTL now: silence is measured against the newest proof.
	stop := now.Add(-2 * time.Minute)
	l.proofs = map[string]time.Time{"self": stop, "a": stop.Add(-ttl + time.Minute), "b": stop.Add(-time.Second)}
	if got := l.judge(); len(got) != 0 || len(l.silent) != 0 {
		t.Errorf("every record stopped: changed %v, silent %v; want nobody drained", got, l.silent)
	}
	// A negative TTL never drains.
	never := newLiveness("self", -1)
	never.proofs = map[string]time.Time{"self": fresh, "a": old}
	if got := never.judge(); len(got) != 0 {
		t.Errorf("TTL off: %v drained", got)
	}
}

// A liveness record counts only under its cluster's own instance id, and
// proves its cluster alive when this importer sees it move, on its own
// clock, whatever time it states: a record filed under another id
// claiming a cluster that writes none (an AWS controller's, say) drains
// nobody, one claiming a drained cluster restores nobody; a writer whose
// clock is 31 minutes slow is not drained, and a record that stops moving
// drains its cluster a TTL after it was last seen to move.
func TestMisfiledRecordsProveNothing(t *testing.T) {
	start := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	w := judgedWatcher(ttl)
	rec := func(id, cluster string, seq int, at time.Time) types.HttpInstanceSummary {
		return types.HttpInstanceSummary{InstanceId: aws.String(id), Attributes: map[string]string{
			recordfmt.AttrClusterID: cluster, attrEpoch: "e", attrSeq: strconv.Itoa(seq), attrUpdated: strconv.FormatInt(at.Unix(), 10), attrBeat: "30"}}
	}
	rev := int64(0)
	read := func(now time.Time, records ...types.HttpInstanceSummary) {
		rev++
		w.proved(now, records, rev, nil)
	}
	// Each beat: self and slow write (slow's clock 31 minutes behind),
	// gone wrote once; a forged record claims aws-cluster with an old
	// time.
	var now time.Time
	for beat := range 5 {
		now = start.Add(time.Duration(beat) * 10 * time.Minute)
		read(now, rec("self", "self", beat, now), rec("slow", "slow", beat, now.Add(-31*time.Minute)),
			rec("gone", "gone", 0, start), rec("forged", "aws-cluster", 0, start.Add(-time.Hour)))
		if !w.alive.silentSince("slow").IsZero() || !w.alive.proofs["aws-cluster"].IsZero() {
			t.Fatalf("at beat %d: silent %v, proofs %v; want slow never drained, no proof of aws-cluster", beat, w.alive.silent, w.alive.proofs)
		}
		if drained := !w.alive.silentSince("gone").IsZero(); drained != (now.Sub(start) > ttl) {
			t.Fatalf("at beat %d (%v after gone's last move): gone drained %v", beat, now.Sub(start), drained)
		}
	}
	// A misfiled fresh record claiming gone restores it not; nor does its
	// own record read again unchanged, however fresh the time it states.
	now = now.Add(time.Minute)
	read(now, rec("self", "self", 9, now), rec("gone", "gone", 0, start), rec("forged", "gone", 7, now))
	if w.alive.silentSince("gone").IsZero() {
		t.Errorf("a misfiled fresh record restored gone: %v", w.alive.silent)
	}
	// Its record moving, though another account wrote it (distrusted),
	// restores it not; moving by its own, it does.
	now = now.Add(time.Minute)
	w.proved(now, []types.HttpInstanceSummary{rec("self", "self", 10, now), rec("gone", "gone", 1, now)}, rev+1, map[string]bool{"gone": true})
	if w.alive.silentSince("gone").IsZero() {
		t.Errorf("a distrusted record restored gone: %v", w.alive.silent)
	}
	now = now.Add(time.Minute)
	w.proved(now, []types.HttpInstanceSummary{rec("self", "self", 11, now), rec("gone", "gone", 2, now.Add(-time.Hour))}, rev+2, nil)
	if !w.alive.silentSince("gone").IsZero() {
		t.Errorf("gone's own record moved (stating an old time) and it stays drained: %v", w.alive.silent)
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

// Time this importer could not read the registry proves nobody silent: a
// registry outage longer than the TTL drains nobody when it ends, though
// this cluster writes before the others do; a cluster silent afterwards
// still drains a TTL later. Reads that are only far apart move nothing.
func TestOutageDrainsNobody(t *testing.T) {
	start := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	w := judgedWatcher(ttl)
	rec := beatRecord
	rev := int64(0)
	read := func(at time.Duration, records ...types.HttpInstanceSummary) {
		rev++
		w.proved(start.Add(at), records, rev, nil)
	}
	read(0, rec("self", 1), rec("a", 1))
	read(time.Minute, rec("self", 1), rec("a", 1))
	// Reads fail from minute 1 to 41; then this cluster's record moves
	// first.
	w.alive.failed(start.Add(time.Minute))
	w.alive.failed(start.Add(20 * time.Minute))
	read(41*time.Minute, rec("self", 2), rec("a", 1))
	if len(w.alive.silent) != 0 {
		t.Fatalf("drained %v right after an outage", w.alive.silent)
	}
	// a never moves again: read every minute, it drains a TTL of seen
	// time after it was first seen (the outage's 40 minutes not counted).
	for m := 42; m <= 80; m++ {
		read(time.Duration(m)*time.Minute, rec("self", m), rec("a", 1))
		if drained := !w.alive.silentSince("a").IsZero(); drained != (m-40 > 30) {
			t.Fatalf("at minute %d: a drained %v", m, drained)
		}
	}
	// No failure, reads 31 minutes apart: b, seen once, is drained.
	read(81*time.Minute, rec("self", 81), rec("b", 1))
	read(112*time.Minute, rec("self", 112), rec("b", 1))
	if w.alive.silentSince("b").IsZero() {
		t.Error("slow reads kept b from draining")
	}
}

// A record declares its writer's beat; a cluster is drained after the TTL
// or four of its declared beats, whichever is longer: one that beats
// every 8 minutes is not drained after the 2-minute TTL, a record that
// declares no beat (an older release's, every 10 minutes) after 40.
func TestDrainedAfterItsOwnBeats(t *testing.T) {
	l := newChangeLog()
	l.alive()
	attrs, _ := l.due(time.Now(), 490*time.Second, "slow", "set")
	if got := declaredBeat(attrs); got != 490*time.Second {
		t.Fatalf("a record written every 490 s declares %v", got)
	}
	start := time.Unix(10_000, 0)
	lv := newLiveness("self", DefaultSilentAfter)
	old := map[string]string{attrEpoch: "e", attrSeq: "1"}
	lv.saw("slow", attrs, start)
	lv.saw("old", old, start)
	for m := 1; m <= 45; m++ {
		now := start.Add(time.Duration(m) * time.Minute)
		lv.saw("self", map[string]string{attrEpoch: "e", attrSeq: strconv.Itoa(m)}, now)
		lv.judge()
		if slow := !lv.silentSince("slow").IsZero(); slow != (m > 4*490/60) {
			t.Errorf("minute %d: slow drained %v", m, slow)
		}
		if old := !lv.silentSince("old").IsZero(); old != (m > 40) {
			t.Errorf("minute %d: old drained %v", m, old)
		}
	}
}

// Every record stopping at once for 10 minutes (Cloud Map failing every
// write while reads answer) drains nobody when the writes come back,
// though this cluster's record moves first: the stall proves nobody
// silent. A cluster that stays silent afterwards is drained a TTL later.
func TestWriteStallDrainsNobody(t *testing.T) {
	start := time.Unix(10_000, 0)
	w := judgedWatcher(DefaultSilentAfter)
	rec := beatRecord
	rev := int64(0)
	// Read every 10 s; self writes at each whole half minute, a 10 s
	// later, until minute 5; then nobody writes until minute 15, when
	// both write again, a twice only (its last read at 15:40).
	selfSeq, aSeq := 0, 0
	for s := 0; s <= 20*60; s += 10 {
		writes := s < 5*60 || s >= 15*60
		if writes && s%30 == 0 {
			selfSeq++
		}
		if writes && s%30 == 10 && s <= 15*60+40 {
			aSeq++
		}
		rev++
		w.proved(start.Add(time.Duration(s)*time.Second), []types.HttpInstanceSummary{rec("self", selfSeq), rec("a", aSeq)}, rev, nil)
		// Drained at the first move of self's record more than the TTL
		// (2 min) after a's last: at 18:00.
		if drained, want := !w.alive.silentSince("a").IsZero(), s >= 18*60; drained != want {
			t.Fatalf("second %d: a drained %v, want %v", s, drained, want)
		}
	}
}

// A write of this cluster's that no one saw end is written again when it
// is forgotten: the export's service through the exporter, the change
// record at once; one seen to end is not.
func TestUnseenWriteIsWrittenAgain(t *testing.T) {
	var again []registry.Key
	b := New(nil, Options{Cluster: "c1", ClusterSet: "set", Log: logr.Discard(), Observer: registry.ObserverFuncs{OnWriteFailed: func(k registry.Key) { again = append(again, k) }}})
	web, record := registry.Key{Namespace: "apps", Name: "web"}, registry.Key{Namespace: ChangesNamespace("set"), Name: ChangesService}
	b.record.alive()
	b.record.due(time.Now(), time.Hour, "c1", "set")
	b.ownOp(aws.String("op-web"), web)
	b.ownOp(aws.String("op-record"), record)
	b.ownOp(aws.String("op-seen"), registry.Key{Namespace: "apps", Name: "api"})
	b.takeOwnOp("op-seen")
	b.expireOwnOps(time.Now().Add(time.Second))
	if !slices.Equal(again, []registry.Key{web}) {
		t.Errorf("written again: %v, want %v", again, web)
	}
	if _, due := b.record.due(time.Now(), time.Hour, "c1", "set"); !due {
		t.Error("the change record whose write was not seen to end is not written again")
	}
}

// judgedWatcher is cluster "self"'s watcher with only what judging
// proofs uses, at ttl.
func judgedWatcher(ttl time.Duration) *Watcher {
	return &Watcher{b: &Backend{o: Options{Cluster: "self", ClusterSet: "set", Log: logr.Discard(), Observer: registry.ObserverFuncs{}}, record: newChangeLog()}, alive: newLiveness("self", ttl),
		dirty: map[registry.Key]time.Time{}, revisions: map[registry.Key]int64{}, exported: map[registry.Key]bool{}}
}

// beatRecord is cluster's record at seq, beating every 30 s.
func beatRecord(cluster string, seq int) types.HttpInstanceSummary {
	return types.HttpInstanceSummary{InstanceId: aws.String(cluster), Attributes: map[string]string{
		recordfmt.AttrClusterID: cluster, attrEpoch: "e", attrSeq: strconv.Itoa(seq), attrUpdated: "0", attrBeat: "30"}}
}
