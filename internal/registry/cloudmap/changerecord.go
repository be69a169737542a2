package cloudmap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// The change record. Each cluster keeps one instance, named after it, in
// the service ChangesService of the namespace ChangesNamespace(clusterset),
// which the owner account creates and shares like the others. Its
// attributes carry an epoch (the writer's start), a sequence number, the
// last changeSlots changes one an attribute ("<seq> <namespace>/<name>")
// and, packed into olderSlots attributes, as many changes before them as
// Cloud Map's limits leave room for. Importers watch
// the service's revision (one DiscoverInstancesRevision per poll, whatever
// the number of services), read the records when it moves, and read the
// services named since the sequence they last saw; a record whose oldest
// slot is newer than that (or a new epoch) asks for a catch-up instead.

// ChangesService names the change record's service; a Kubernetes Service
// name never starts with an underscore.
const ChangesService = "_changes"

// ChangesNamespace names the Cloud Map namespace of a clusterset's change
// records; a Kubernetes namespace name has no dots, so no export lands there.
func ChangesNamespace(clusterSet string) string { return "clustermap." + clusterSet }

const (
	// changeSlots are the newest changes, one an attribute ("c00"...):
	// every release reads them. A record of a release before olderSlots
	// has legacySlots of them.
	changeSlots = 20
	legacySlots = 24
	// olderSlots attributes ("o0"...) pack the changes before those,
	// newest first and comma-separated, each within Cloud Map's 1,024
	// characters a value, the whole record within its 5,000: about 170
	// more changes of 20-character keys, so that a bulk export (20
	// changes a second at a cluster's call budget) does not outrun
	// importers polling every few seconds. 6 attributes + 20 + 4 make
	// Cloud Map's 30. A release that reads only the single slots catches
	// up when it is behind them, as it did.
	olderSlots = 4
	// maxRecent bounds the changes a writer keeps to pack.
	maxRecent = 256
	// packedFor is how long a change stays in the packed attributes:
	// long enough for an importer a few polls behind, short enough that
	// the records every importer reads at every heartbeat shrink back to
	// the single slots after a burst (50 records of 5,000 characters are
	// 250 KB a read; in the 50-cluster benchmark, records that kept a
	// bulk's changes for good made every change take 30 s or more).
	packedFor = time.Minute
	// recordChars and valueChars are Cloud Map's limits on an instance's
	// attributes: all keys and values together, and one value.
	recordChars = 5000
	valueChars  = 1024
	// ChangeWriteInterval spaces a cluster's change-record writes: a
	// change alone is written at once, a burst once per interval.
	ChangeWriteInterval = 2 * time.Second
	// MinHeartbeat is how often an exporting cluster rewrites an idle
	// record, its proof of life (WatchOptions.Heartbeat sets it). The
	// importers of a one-account clusterset look up each other
	// cluster's writes (GetOperation) up to 5 clusters, under one call a
	// second for the account; past that they read the records instead
	// (operationsFeed.byRecords), as across accounts.
	MinHeartbeat = 30 * time.Second
	// MaxHeartbeat is the slowest beat, and the beat of a record that
	// declares none (a release before beats were declared wrote every 10
	// minutes) or more.
	MaxHeartbeat = 10 * time.Minute

	attrEpoch   = "epoch"
	attrSeq     = "seq"
	attrUpdated = "updated"
	// attrBeat declares the writer's heartbeat in seconds: an importer
	// drains a cluster only after several of them (liveness.go).
	attrBeat = "beat"
)

// declaredBeat is the heartbeat a record declares, from a second (tests
// beat every few) to MaxHeartbeat; none or unreadable: MaxHeartbeat.
func declaredBeat(attrs map[string]string) time.Duration {
	s, err := strconv.Atoi(attrs[attrBeat])
	if err != nil || s <= 0 {
		return MaxHeartbeat
	}
	return min(max(time.Duration(s)*time.Second, time.Second), MaxHeartbeat)
}

type change struct {
	seq int64
	key registry.Key
	at  time.Time // when noted; zero as read
}

// changeLog is what this cluster's change record says, and whether the
// record is behind it.
type changeLog struct {
	mu      sync.Mutex
	epoch   string
	seq     int64
	recent  []change // oldest first; one entry per key
	unsent  bool
	written time.Time
	wake    chan struct{}
	// clusters is how many clusters' records the watcher last read.
	clusters int
}

func newChangeLog() *changeLog {
	return &changeLog{epoch: strconv.FormatInt(time.Now().UnixNano(), 36), wake: make(chan struct{}, 1)}
}

// note records a change of key; the writer sends it soon.
func (l *changeLog) note(key registry.Key) {
	l.mu.Lock()
	l.seq++
	l.recent = slices.DeleteFunc(l.recent, func(c change) bool { return c.key == key })
	l.recent = append(l.recent, change{l.seq, key, time.Now()})
	if len(l.recent) > maxRecent {
		l.recent = l.recent[len(l.recent)-maxRecent:]
	}
	l.unsent = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// due returns the record's attributes when it must be written: changes
// unsent, or a heartbeat due.
func (l *changeLog) due(now time.Time, heartbeat time.Duration, cluster, clusterSet string) (map[string]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seq == 0 || !l.unsent && now.Sub(l.written) < heartbeat {
		return nil, false // nothing exported yet (or a Region this cluster only reads), or nothing new
	}
	attrs := map[string]string{
		recordfmt.AttrClusterID: cluster, recordfmt.AttrClusterSetID: clusterSet,
		attrEpoch: l.epoch, attrSeq: strconv.FormatInt(l.seq, 10), attrUpdated: strconv.FormatInt(now.Unix(), 10),
		attrBeat: strconv.Itoa(int(max(heartbeat, time.Second).Seconds())),
	}
	packChanges(attrs, l.recent, now.Add(-packedFor))
	l.unsent = false
	return attrs, true
}

// packChanges adds recent (oldest first) to a record's attrs: the newest
// changeSlots one an attribute, then as many older ones noted since
// cutoff as fit, newest first. What it leaves out is older than
// everything it adds, so a reader can tell from the oldest sequence it
// finds whether it missed any.
func packChanges(attrs map[string]string, recent []change, cutoff time.Time) {
	single := recent[max(0, len(recent)-changeSlots):]
	for i, c := range single {
		attrs[fmt.Sprintf("c%02d", i)] = c.text()
	}
	used := 0
	for k, v := range attrs {
		used += len(k) + len(v)
	}
	older := recent[:len(recent)-len(single)]
	slot, val := 0, ""
	for i := len(older) - 1; i >= 0 && !older[i].at.Before(cutoff); i-- {
		text := older[i].text()
		if val != "" && len(val)+1+len(text) > valueChars {
			attrs[olderSlot(slot)] = val
			used += len(olderSlot(slot)) + len(val)
			slot, val = slot+1, ""
		}
		grown := text
		if val != "" {
			grown = val + "," + text
		}
		if slot == olderSlots || len(grown) > valueChars || used+len(olderSlot(slot))+len(grown) > recordChars {
			break
		}
		val = grown
	}
	if val != "" {
		attrs[olderSlot(slot)] = val
	}
}

func olderSlot(i int) string { return "o" + strconv.Itoa(i) }

func (c change) text() string { return strconv.FormatInt(c.seq, 10) + " " + c.key.String() }

// parseChange reads one change as text wrote it.
func parseChange(v string) (change, bool) {
	seqText, keyText, _ := strings.Cut(v, " ")
	ns, name, ok := strings.Cut(keyText, "/")
	s, err := strconv.ParseInt(seqText, 10, 64)
	return change{seq: s, key: registry.Key{Namespace: ns, Name: name}}, ok && err == nil
}

// alive says this cluster exports, in one account, where its record only
// proves it alive (liveness.go): the record is written, then rewritten
// every heartbeat.
func (l *changeLog) alive() {
	l.mu.Lock()
	if l.seq == 0 {
		l.seq, l.unsent = 1, true
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// retire stops the writes until this cluster exports again.
func (l *changeLog) retire() {
	l.mu.Lock()
	l.seq, l.recent, l.unsent = 0, nil, false
	l.mu.Unlock()
}

// nextBeat is how long until the record is due again by the heartbeat.
// With nothing exported no record is due: a heartbeat's wait, and the
// first export wakes the writer (without this, a cluster that only
// imports spun a core on waits of zero).
func (l *changeLog) nextBeat(now time.Time, heartbeat time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seq == 0 {
		return heartbeat
	}
	return max(0, l.written.Add(heartbeat).Sub(now))
}

// failed puts a write that did not happen back, and wakes the writer (a
// write that failed after it was accepted is heard of while it waits).
func (l *changeLog) failed() {
	l.mu.Lock()
	l.unsent = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// heard notes how many clusters' records the watcher read.
func (l *changeLog) heard(clusters int) {
	l.mu.Lock()
	l.clusters = clusters
	l.mu.Unlock()
}

// clustersHeard is how many clusters' records the watcher last read.
func (l *changeLog) clustersHeard() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clusters
}

// heartbeat is this cluster's beat: the one set, else MinHeartbeat.
func (b *Backend) heartbeat(set time.Duration) time.Duration {
	return cmp.Or(set, MinHeartbeat)
}

// pollers is how many clusters poll ListOperations in this account: the
// clusters whose records were last read (those that export), none across
// accounts, where the change feed lists no operations.
func (b *Backend) pollers() int {
	if b.tenancy.feedsByRecords() {
		return 0
	}
	return b.record.clustersHeard()
}

func (l *changeLog) sent(now time.Time) {
	l.mu.Lock()
	l.written = now
	l.mu.Unlock()
}

// writeChanges keeps this cluster's change record up to date until ctx
// ends: at once after a quiet spell, then at most once per
// ChangeWriteInterval while changes come.
func (b *Backend) writeChanges(ctx context.Context) {
	opts := b.o.Watch
	opts.defaults()
	for {
		// What is due is decided under the lock too: a withdrawal of the
		// record (retireRecord) may run meanwhile, and a write decided
		// before it would bring the record back after it.
		b.recordMu.Lock()
		beat := b.heartbeat(opts.Heartbeat)
		attrs, ok := b.record.due(time.Now(), beat, b.o.Cluster, b.o.ClusterSet)
		var err error
		if ok {
			err = b.writeRecord(ctx, attrs)
		}
		b.recordMu.Unlock()
		if ok {
			var busy *types.DuplicateRequest
			switch {
			case errors.As(err, &busy):
				b.record.failed() // the last write still runs: this one comes after it
			case err != nil:
				b.record.failed()
				b.o.Log.Error(err, "writing this cluster's change record failed; other accounts see its changes later", "retryIn", ChangeWriteInterval)
			default:
				b.record.sent(time.Now())
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(ChangeWriteInterval):
			}
			continue
		}
		// Due a heartbeat after the last write (a ticker started before
		// it skipped every other beat).
		select {
		case <-ctx.Done():
			return
		case <-b.record.wake:
		case <-time.After(b.record.nextBeat(time.Now(), beat)):
		}
	}
}

// writeRecord registers this cluster's change record (a re-registration
// replaces its attributes).
func (b *Backend) writeRecord(ctx context.Context, attrs map[string]string) error {
	ns := ChangesNamespace(b.o.ClusterSet)
	nsRef, err := b.ensureNamespace(ctx, ns)
	if err != nil {
		return err
	}
	key := registry.Key{Namespace: ns, Name: ChangesService}
	svc, err := b.ensureService(ctx, nsRef, key)
	if err != nil {
		return err
	}
	write := cloudmapclient.Write{ID: b.o.Cluster, Attributes: attrs}
	return cloudmapclient.WriteInstances(ctx, b.c, svc, []cloudmapclient.Write{write}, func(_ int, o cloudmapclient.Outcome) error {
		if o.NoService {
			b.forget(key)
		}
		if o.Err == nil {
			// Laid over reads, so that a withdrawal right after
			// (retireRecord) sees the record its lagging read does not
			// show yet; a write that fails later goes again (opFinished).
			b.sent(key, write, o.Op)
		}
		return o.Err
	})
}

// recordOf is the cluster a change record proves and announces changes
// of: the one its CLUSTER_ID names, when its instance id is that name, as
// every writer's is. A record under another id is forged or corrupt and
// counts for no one; reported says so, once a while.
func (b *Backend) recordOf(in types.HttpInstanceSummary) (string, bool) {
	c, id := in.Attributes[recordfmt.AttrClusterID], aws.ToString(in.InstanceId)
	if c == "" || id != c {
		if c != "" && b.due("misfiled record "+id) {
			b.o.Log.Error(nil, "ignored a liveness and change record whose instance id is not its cluster's: forged or corrupt; it drains, restores and announces no one: deregister it",
				"instance", id, "cluster", c, "service", ChangesNamespace(b.o.ClusterSet)+"/"+ChangesService)
		}
		return "", false
	}
	return c, true
}

// record is one cluster's change record, as read.
type record struct {
	epoch   string
	seq     int64
	oldest  int64 // the oldest slot's sequence; 0 without slots
	changes []change
	updated time.Time
	beat    time.Duration // declaredBeat
}

func parseRecord(attrs map[string]string) (record, bool) {
	r := record{epoch: attrs[attrEpoch], beat: declaredBeat(attrs)}
	seq, err := strconv.ParseInt(attrs[attrSeq], 10, 64)
	if err != nil || r.epoch == "" {
		return r, false
	}
	r.seq = seq
	if t, err := strconv.ParseInt(attrs[attrUpdated], 10, 64); err == nil {
		r.updated = time.Unix(t, 0)
	}
	var texts []string
	for i := range legacySlots {
		if v, ok := attrs[fmt.Sprintf("c%02d", i)]; ok {
			texts = append(texts, v)
		}
	}
	for i := range olderSlots {
		if v, ok := attrs[olderSlot(i)]; ok {
			texts = append(texts, strings.Split(v, ",")...)
		}
	}
	for _, v := range texts {
		c, ok := parseChange(v)
		if !ok {
			return r, false
		}
		r.changes = append(r.changes, c)
		if r.oldest == 0 || c.seq < r.oldest {
			r.oldest = c.seq
		}
	}
	return r, true
}

// since is what changed after seq, and whether the record still holds all
// of it (else the reader catches up).
func (r record) since(epoch string, seq int64) ([]registry.Key, bool) {
	if epoch != r.epoch {
		// A new writer (a restart): its first changes may be gone from
		// the slots already, unless it made no more than fit.
		if r.oldest > 1 {
			return nil, false
		}
		seq = 0
	}
	if r.seq <= seq {
		return nil, true
	}
	if r.oldest == 0 || seq < r.oldest-1 {
		return nil, false
	}
	var keys []registry.Key
	for _, c := range r.changes {
		if c.seq > seq {
			keys = append(keys, c.key)
		}
	}
	return keys, true
}
