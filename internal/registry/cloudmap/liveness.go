package cloudmap

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Liveness. Every cluster that exports proves it is alive with its change
// record (changerecord.go), rewritten at least every heartbeat, in one account
// as across accounts. An importer drains the exports of a cluster whose
// record it has not seen move for SilentAfter: they stay imported, not
// routed to (registry.Export.Silent). Proofs are on the importer's own
// clock, when it saw the record change, never the time the record states:
// a writer's slow clock, or a record rewritten with an old time, drains
// no one, and a record first seen counts as moved then. Only on positive
// knowledge: right after a read of the records that answered, and only
// against another record that kept moving (this cluster's own included),
// so that an outage or a quiet clusterset drains nobody. A cluster that
// never wrote a record (an older release, the AWS controller) is never
// drained, nor is this one.

// DefaultSilentAfter is four of the quickest heartbeats: a controller
// restart or upgrade of a minute drains nobody, and a cluster that dies
// whole leaves every other's path within 3 minutes (docs/traffic.md). A
// registry outage drains nobody whatever its length (judge). A cluster
// that declares a slower beat is given four of its own.
const DefaultSilentAfter = 4 * MinHeartbeat

// silentBeats is how many of its declared heartbeats a cluster's record
// may stand still before it is drained, when that is past the TTL.
const silentBeats = 4

// DefaultProofReadInterval spaces the reads of the records in one account
// (one DiscoverInstancesRevision, a data-plane call, and a DiscoverInstances
// when they changed; another cluster's heartbeat asks for one sooner);
// across accounts they are read at every poll anyway.
const DefaultProofReadInterval = 10 * time.Second

// liveness holds every cluster's last proof (when its record was seen to
// move, how it read then and the beat it declared) and who is drained.
type liveness struct {
	self   string
	ttl    time.Duration // <= 0: never drain
	proofs map[string]time.Time
	marks  map[string]string
	beats  map[string]time.Duration
	silent map[string]time.Time
	// lastRead is when the records were last read.
	lastRead time.Time
	// blind is when reads of the registry began to fail (zero: they do
	// not).
	blind time.Time
}

func newLiveness(self string, ttl time.Duration) *liveness {
	return &liveness{self: self, ttl: ttl, proofs: map[string]time.Time{}, marks: map[string]string{}, beats: map[string]time.Duration{}, silent: map[string]time.Time{}}
}

// failed notes that a read of the registry failed at now.
func (l *liveness) failed(now time.Time) {
	if l.blind.IsZero() {
		l.blind = now
	}
}

// reading notes a read of the records at now. Time this importer could
// not read the registry (an outage, its own) proves nobody silent: the
// live clusters' proofs move on by it, so that after an outage no one is
// drained for writing after this cluster did. (Reads that are only slow
// move nothing.)
func (l *liveness) reading(now time.Time) {
	if !l.blind.IsZero() {
		l.pause(now.Sub(l.blind))
		l.blind = time.Time{}
	}
}

// pause moves the proofs of the clusters not drained on by d: time that
// proves nobody silent.
func (l *liveness) pause(d time.Duration) {
	for cluster, at := range l.proofs {
		if _, drained := l.silent[cluster]; !drained {
			l.proofs[cluster] = at.Add(d)
		}
	}
}

// stalled notes, before the proofs of a read in which a record moved,
// how long reads had found no record moving (until the read before this
// one: reads only far apart prove no stall): past two of the quickest
// beats declared by clusters not drained, every record had stopped at
// once (Cloud Map refusing writes, a role all clusters share revoked),
// and that time proves nobody silent either; else the first cluster to
// write again would drain every other until its next beat.
func (l *liveness) stalled() {
	var newest time.Time
	quickest := MaxHeartbeat
	for cluster, at := range l.proofs {
		if _, drained := l.silent[cluster]; drained {
			continue
		}
		if at.After(newest) {
			newest = at
		}
		quickest = min(quickest, l.beats[cluster])
	}
	if gap := l.lastRead.Sub(newest) - 2*quickest; !newest.IsZero() && gap > 0 {
		l.pause(gap)
	}
}

// saw notes cluster's record as read at now: a proof when it moved (or is
// new) since the last read.
func (l *liveness) saw(cluster string, attrs map[string]string, now time.Time) {
	if l.moved(cluster, attrs) {
		l.marks[cluster], l.proofs[cluster], l.beats[cluster] = recordMark(attrs), now, declaredBeat(attrs)
	}
}

// silentAfter is how long cluster's record may stand still while others
// move: the TTL, or silentBeats of the beats it declares when longer (a
// large clusterset in one account beats slower; releases before beats
// were declared, every 10 minutes).
func (l *liveness) silentAfter(cluster string) time.Duration {
	return max(l.ttl, silentBeats*l.beats[cluster])
}

// moved says whether cluster's record reads otherwise than last time.
func (l *liveness) moved(cluster string, attrs map[string]string) bool {
	prev, ok := l.marks[cluster]
	return !ok || prev != recordMark(attrs)
}

func recordMark(attrs map[string]string) string {
	return attrs[attrEpoch] + " " + attrs[attrSeq] + " " + attrs[attrUpdated]
}

// forget drops a cluster whose record is gone.
func (l *liveness) forget(cluster string) {
	delete(l.proofs, cluster)
	delete(l.marks, cluster)
	delete(l.beats, cluster)
}

// judge drains and restores clusters from the proofs as last read
// (registry.JudgeSilent); it returns the clusters whose state changed.
func (l *liveness) judge() []string {
	return registry.JudgeSilent(l.proofs, l.silent, l.self, func(cluster string) time.Duration {
		if l.ttl <= 0 {
			return 0
		}
		return l.silentAfter(cluster)
	})
}

// silentSince is the last proof of a drained cluster (zero: not drained).
func (l *liveness) silentSince(cluster string) time.Time { return l.silent[cluster] }

// readRecords reads every cluster's record of the clusterset: nil, nil
// when none was written yet.
func (b *Backend) readRecords(ctx context.Context) (*sd.DiscoverInstancesOutput, error) {
	out, err := b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(ChangesNamespace(b.o.ClusterSet)), ServiceName: aws.String(ChangesService), OwnerAccount: b.tenancy.ownerAccount(),
		HealthStatus: types.HealthStatusFilterAll, MaxResults: aws.Int32(recordfmt.MaxInstances),
		QueryParameters: map[string]string{recordfmt.AttrClusterSetID: b.o.ClusterSet},
	})
	if isNotFound(err) {
		return nil, nil
	}
	return out, err
}

// proved notes the records that moved as proofs (instances: the records
// as read, at revision rev; distrusted: clusters whose record, though
// there, proves nothing) and judges; every service is read again when a
// cluster was drained or restored, so that its exports say so.
func (w *Watcher) proved(now time.Time, instances []types.HttpInstanceSummary, rev int64, distrusted map[string]bool) {
	if rev >= 0 && rev < w.recordRev {
		// A read behind the last one (Cloud Map's reads may trail its
		// writes): its proofs are older than those held.
		return
	}
	w.records, w.recordRev = instances, rev
	w.alive.reading(now)
	for _, in := range instances {
		if cluster, ok := w.b.recordOf(in); ok && !distrusted[cluster] && w.alive.moved(cluster, in.Attributes) {
			w.alive.stalled()
			break
		}
	}
	seen := map[string]bool{}
	for _, in := range instances {
		cluster, ok := w.b.recordOf(in)
		if !ok {
			continue
		}
		seen[cluster] = true
		if !distrusted[cluster] {
			w.alive.saw(cluster, in.Attributes, now)
		}
	}
	for cluster := range w.alive.proofs {
		if !seen[cluster] {
			w.alive.forget(cluster)
		}
	}
	w.b.record.heard(len(seen))
	w.alive.lastRead = now
	changed := w.alive.judge()
	for _, cluster := range changed {
		since, silent := w.alive.silent[cluster]
		if silent {
			w.b.o.Log.Info("draining a silent cluster: its endpoints stay imported, not routed to, until it proves alive again (or clustermap forget-cluster)",
				"cluster", cluster, "lastProof", since, "silentAfter", w.alive.silentAfter(cluster))
		} else {
			w.b.o.Log.Info("a drained cluster proved alive again (or its record went); routing to it again", "cluster", cluster)
		}
		w.b.o.Observer.Silent(cluster, w.alive.proofs[cluster], silent)
	}
	if len(changed) > 0 {
		// Every export's Silent may change: read and report again.
		clear(w.reported)
		for key := range w.revisions {
			w.dirty[key] = time.Time{}
		}
		for key := range w.exported {
			w.dirty[key] = time.Time{}
		}
	}
	drained := map[string]bool{}
	for c := range w.alive.silent {
		drained[c] = true
	}
	w.b.o.Observer.Proofs(maps.Clone(w.alive.proofs), drained)
}

// retireRecord, in one account, removes this cluster's record with its
// last export, and the record's service and namespace when nothing else
// is left in them: an uninstalled cluster leaves nothing in Cloud Map.
// Across accounts the record stays: it tells the others of the withdrawal.
func (b *Backend) retireRecord(ctx context.Context, key registry.Key) error {
	b.mu.Lock()
	delete(b.exporting, key)
	last := len(b.exporting) == 0
	b.mu.Unlock()
	if b.tenancy.feedsByRecords() || !last {
		return nil
	}
	b.recordMu.Lock()
	defer b.recordMu.Unlock()
	b.record.retire()
	rec := registry.Key{Namespace: ChangesNamespace(b.o.ClusterSet), Name: ChangesService}
	for range 20 {
		if err := b.withdraw(ctx, rec); !errors.Is(err, ErrPending) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return ErrPending
}
