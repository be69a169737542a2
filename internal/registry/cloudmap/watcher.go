package cloudmap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// WatchOptions tune change detection. The defaults keep an idle cluster at
// about 40 calls a minute plus a page per 100 services every 5 minutes:
// ListOperations every PollInterval, a listing of namespaces and services
// every ListInterval, and a revision check of every known service every
// SweepInterval (6 h: with 2,000 services, 5.6 calls a minute amortized).
type WatchOptions struct {
	PollInterval  time.Duration
	ListInterval  time.Duration
	SweepInterval time.Duration
	// Overlap is how long an operation is taken to run at most: polls
	// read past an operation until one that came at least Overlap after
	// it was first seen did, for those created before it and still
	// running when it was seen.
	Overlap time.Duration
	// After a poll that saw changes, polls come every FastInterval for
	// ActiveWindow: changes come in bursts (a pod registered not ready,
	// then ready), and the burst's tail need not wait a whole PollInterval.
	// Idle clusters never poll faster than PollInterval.
	FastInterval, ActiveWindow time.Duration
	// ConfirmAbsence is how long after a read that finds a service exported
	// nowhere a second read must confirm it before its imports go: Cloud
	// Map's reads are eventually consistent.
	ConfirmAbsence time.Duration
	// Foreign operations are attributed to their services one GetOperation
	// each, GetOperationRate per second on average and MaxGetOperations at
	// once; past that budget, a catch-up (a listing and a revision check of
	// every known service, data-plane calls) finds the changes at a cost
	// that does not grow with the operations. The budget keeps a bulk export
	// elsewhere from taking this cluster's control-plane calls.
	MaxGetOperations int
	GetOperationRate float64
	// CatchUpInterval spaces catch-ups during a long burst.
	CatchUpInterval time.Duration
	// MaxLookback is how far back a poll reads operations after a gap;
	// a longer gap is caught up instead.
	MaxLookback time.Duration
	// Heartbeat is how often an exporting cluster rewrites its change
	// record, its proof of life (zero: heartbeatFor the clusterset);
	// SilentAfter drains the exports of a cluster whose record stood
	// still that long, or four of the heartbeats it declares if longer,
	// while others moved (liveness.go), until it proves alive again: at
	// least three heartbeats; negative: never.
	Heartbeat, SilentAfter time.Duration
	// ProofReadInterval spaces the reads of the proofs in one account.
	ProofReadInterval time.Duration
	// MaxPollPages bounds the ListOperations pages of one poll: Cloud Map
	// pages through every operation of the account before it filters, and
	// past this many a catch-up costs less.
	MaxPollPages int
	// ReadLag is how long after a change Cloud Map's data plane may still
	// show the service as it was, or part of the change: a changed service
	// is read again StaleRetry later, then twice as long each time, and
	// once when the window ends (4 reads in all at the defaults).
	ReadLag, StaleRetry time.Duration
	// OperationWait is how long an operation is taken to possibly run
	// after the change it makes was announced, where its end cannot be
	// seen: across accounts, where a change record (written as the
	// change is sent) announces it and no operation can be listed, a
	// changed service is read for OperationWait past ReadLag.
	OperationWait time.Duration
}

// Validate says what is wrong with the options a user set.
func (o WatchOptions) Validate() error {
	o.defaults()
	beat := o.Heartbeat
	if beat == 0 {
		beat = MinHeartbeat
	}
	if o.SilentAfter > 0 && o.SilentAfter < 3*beat {
		return fmt.Errorf("a silent-cluster TTL of %v is under three heartbeats (%v): a cluster that is only quiet would be drained", o.SilentAfter, 3*beat)
	}
	return nil
}

// WithDefaults is the options as the watcher runs them: a zero field is
// the shipped default.
func (o WatchOptions) WithDefaults() WatchOptions {
	o.defaults()
	return o
}

// Reread is how long after its first read the watcher reads a changed
// service again once a read may no longer trail the change by lag: the
// first re-read of its schedule (StaleRetry, then twice as long each time,
// then the window's end) at or past lag.
func (o WatchOptions) Reread(lag time.Duration) time.Duration {
	o.defaults()
	at := time.Duration(0)
	for reads := 0; at < lag && at < o.ReadLag; reads++ {
		at = min(at+o.rereadAfter(reads), o.ReadLag)
	}
	return at
}

// rereadAfter is how long after a changed service's read number reads
// (0: the first) it is read again, the window's end aside.
func (o WatchOptions) rereadAfter(reads int) time.Duration {
	return o.StaleRetry << min(reads, 8)
}

func (o *WatchOptions) defaults() {
	o.PollInterval = cmp.Or(o.PollInterval, 1500*time.Millisecond)
	o.ListInterval = cmp.Or(o.ListInterval, 5*time.Minute)
	// Only a safety net: gaps are read back from the operations, so
	// the sweep (a call per known service) can be rare.
	o.SweepInterval = cmp.Or(o.SweepInterval, 6*time.Hour)
	o.Overlap = cmp.Or(o.Overlap, 10*time.Second)
	o.FastInterval = cmp.Or(o.FastInterval, 300*time.Millisecond)
	o.ActiveWindow = cmp.Or(o.ActiveWindow, 5*time.Second)
	o.ConfirmAbsence = cmp.Or(o.ConfirmAbsence, 5*time.Second)
	// A quarter of the shipped control-plane budget: enough for a steady
	// stream of ordinary changes elsewhere, not for a bulk export.
	o.MaxGetOperations = cmp.Or(o.MaxGetOperations, 20)
	o.GetOperationRate = cmp.Or(o.GetOperationRate, 5)
	o.CatchUpInterval = cmp.Or(o.CatchUpInterval, 3*time.Second)
	o.MaxLookback = cmp.Or(o.MaxLookback, time.Hour)
	o.SilentAfter = cmp.Or(o.SilentAfter, DefaultSilentAfter)
	o.ProofReadInterval = cmp.Or(o.ProofReadInterval, DefaultProofReadInterval)
	o.MaxPollPages = cmp.Or(o.MaxPollPages, 5)
	o.ReadLag = cmp.Or(o.ReadLag, DefaultReadLag)
	o.StaleRetry = cmp.Or(o.StaleRetry, 500*time.Millisecond)
	o.OperationWait = cmp.Or(o.OperationWait, DefaultOperationWait)
}

// DefaultOperationWait is WatchOptions.OperationWait.
const DefaultOperationWait = cloudmapclient.OperationRun

// DefaultReadLag is how long after a write Cloud Map's reads are taken to
// possibly not show it (WatchOptions.ReadLag).
const DefaultReadLag = 5 * time.Second

// Watcher turns Cloud Map changes into Sink calls.
type Watcher struct {
	b      *Backend
	sink   registry.Sink
	opts   WatchOptions
	synced bool // the sink heard Synced

	// dirty holds the services to read, each with the time before which
	// not to: a read that fails backs off per service.
	dirty      map[registry.Key]time.Time
	backoff    workqueue.TypedRateLimiter[registry.Key]
	absent     map[registry.Key]time.Time // first read that found an exported service gone
	unreadable map[registry.Key]bool
	revisions  map[registry.Key]int64
	exported   map[registry.Key]bool // keys the sink last heard exports for
	// settling are the services changed within ReadLag, until when; behind
	// counts reads in a row that went back past the revision held.
	settling map[registry.Key]settling
	behind   map[registry.Key]int
	clock    clock
	feed     feed
	// written is each service's other-cluster instances' AttrWritten as
	// last read: a new value is a registration that propagated.
	written map[registry.Key]map[string]string
	started time.Time
	// alive judges every cluster's proof of life; records are the change
	// records as last read, and when.
	alive     *liveness
	records   []types.HttpInstanceSummary
	recordRev int64
	proofsAt  time.Time
	decoded   *decodeCache
	// reported is the sum of each service's records (decodeCache.sum) as
	// last reported with exports: a read of the same records (a re-read
	// within the read lag finds them unchanged, mostly) decodes and
	// reports nothing. Cleared when a cluster is drained or restored.
	reported map[registry.Key]uint64
	// exporters are the clusters whose exports were read since the start.
	exporters map[string]bool
}

type feedMark struct {
	epoch string
	seq   int64
}

// newWatcher watches the clusterset of a backend.
func newWatcher(b *Backend, sink registry.Sink) *Watcher {
	opts := b.o.Watch
	opts.defaults()
	w := &Watcher{
		b: b, sink: sink, opts: opts,
		dirty: map[registry.Key]time.Time{}, revisions: map[registry.Key]int64{},
		exported: map[registry.Key]bool{}, absent: map[registry.Key]time.Time{}, unreadable: map[registry.Key]bool{},
		written: map[registry.Key]map[string]string{}, started: time.Now(),
		settling: map[registry.Key]settling{}, behind: map[registry.Key]int{},
		backoff: workqueue.NewTypedItemExponentialFailureRateLimiter[registry.Key](time.Second, 2*time.Minute),
		alive:   newLiveness(b.o.Cluster, opts.SilentAfter), recordRev: -1, decoded: newDecodeCache(b.maxImportEndpoints()),
		exporters: map[string]bool{}, reported: map[registry.Key]uint64{},
	}
	if b.tenancy.feedsByRecords() {
		w.feed = newRecordsFeed(w)
	} else {
		w.feed = newOperationsFeed(w)
	}
	return w
}

// Start runs until ctx ends (a controller-runtime Runnable).
func (w *Watcher) Start(ctx context.Context) error {
	w.clock.LastSweep = time.Now()
	for {
		w.clock.Now = time.Now()
		st := nextStep(w.clock, w.opts)
		err := w.do(ctx, st)
		retryIn := w.opts.PollInterval
		if st == stepList || st == stepCatchUp {
			retryIn = w.listed(st, err)
		}
		if err != nil {
			w.b.o.Log.Error(err, "reading Cloud Map failed; imports stay as they are", "step", st.String(), "retryIn", retryIn)
			w.alive.failed(w.clock.Now)
		}
		w.b.o.Observer.Read(err)
		w.fetchDirty(ctx)
		// Every service was tried once: those whose read failed are
		// unreadable, not gone, and block no other import.
		if w.clock.Synced && !w.synced {
			w.sink.Synced()
			w.synced = true
		}
		w.clock.Now, w.clock.Pollers = time.Now(), w.b.pollers()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(nextWait(w.clock, w.opts)):
		case key := <-w.b.changed:
			w.changed(key, time.Now())
			// A bulk export queues many: all are read in the next pass,
			// not one pass (and one poll) each.
			for more := true; more; {
				select {
				case key := <-w.b.changed:
					w.changed(key, time.Now())
				default:
					more = false
				}
			}
		case key := <-w.b.checks:
			w.check(key)
		}
	}
}

// listed takes in how a listing step ended, and says when a failed one is
// tried again: after a backoff with jitter (listBackoff), so that the
// importers of a clusterset throttled together do not retry together;
// polls go on meanwhile, and what a failed catch-up was to find is still
// wanted.
func (w *Watcher) listed(st step, err error) time.Duration {
	if err == nil {
		w.clock.ListFailures, w.clock.ListRetryAt = 0, time.Time{}
		return 0
	}
	w.clock.ListFailures++
	d := listBackoff(w.clock.ListFailures, w.opts)
	d = d/2 + rand.N(d/2+1)
	w.clock.ListRetryAt = time.Now().Add(d)
	if st == stepCatchUp {
		w.clock.CatchUpWanted = true
	}
	return d
}

// changed marks a service changed at now: read it now, and go on reading
// it until a read shows the change (settled). Across accounts a change is
// heard of before its operation ends (OperationWait).
func (w *Watcher) changed(key registry.Key, now time.Time) {
	if _, pending := w.dirty[key]; !pending || w.dirty[key].After(now) {
		w.dirty[key] = time.Time{}
	}
	window := w.opts.ReadLag
	if w.b.tenancy.heardEarly() {
		window += w.opts.OperationWait
	}
	w.settling[key] = settling{until: now.Add(window)}
}

// heardEarly is changed for a change heard of from its writer's change
// record, which may be read before the change's operation ended.
func (w *Watcher) heardEarly(key registry.Key, now time.Time) {
	w.changed(key, now)
	w.settling[key] = settling{until: now.Add(w.opts.ReadLag + w.opts.OperationWait)}
}

// settling is a service changed within ReadLag: until when, and how many
// reads since the change.
type settling struct {
	until time.Time
	reads int
}

// maxBehind is how many reads in a row may go back past the revision held
// before the older one is taken: a service deleted and made again starts
// over.
const maxBehind = 10

// settled decides, after a read of a service at revision rev, whether the
// read stands or the service is read again (and when). A read may trail a
// change by up to ReadLag, and a change of several operations may show in
// part: a service changed within ReadLag is read again StaleRetry later,
// then twice as long each time, and once when the window ends. It returns
// false for a read to ignore, one that went back past the revision held.
func (w *Watcher) settled(key registry.Key, rev int64, now time.Time) bool {
	if held, had := w.revisions[key]; had && rev < held && w.behind[key] < maxBehind {
		w.behind[key]++
		w.dirty[key] = now.Add(w.opts.StaleRetry)
		return false
	}
	delete(w.behind, key)
	s, changing := w.settling[key]
	if !changing {
		return true
	}
	if !now.Before(s.until) {
		delete(w.settling, key) // this read is the last of the window
		return true
	}
	next := now.Add(w.opts.rereadAfter(s.reads))
	if next.After(s.until) {
		next = s.until
	}
	s.reads++
	w.settling[key] = s
	w.dirty[key] = next
	return true
}

// check reads a service the cluster imports as one the sink heard exports
// of: a read that finds it absent is confirmed before the sink hears so.
// One the watcher reads already is left to its reads.
func (w *Watcher) check(key registry.Key) {
	if w.exported[key] || w.unreadable[key] {
		return
	}
	w.exported[key] = true
	if _, pending := w.dirty[key]; !pending {
		w.dirty[key] = time.Time{}
	}
}

// do runs one step and records when it succeeded.
func (w *Watcher) do(ctx context.Context, st step) error {
	start := w.clock.Now
	switch st {
	case stepList:
		if !w.clock.Synced {
			// The first listing reads every service: the operations (or
			// change records) before it are covered, not new.
			// Only listings run before it: nothing to hand back to polls.
			if _, err := w.feed.baseline(ctx); err != nil {
				return err
			}
		}
		if err := w.list(ctx, !w.clock.Synced); err != nil {
			return err
		}
		if !w.clock.Synced {
			// As after a catch-up: the first reads may not show a change
			// made just before them (ReadLag), nor one still running.
			w.clock.ResweepAt = start.Add(w.opts.ReadLag)
			w.clock.ResweepAgainAt = start.Add(w.opts.OperationWait + w.opts.ReadLag)
		}
		w.clock.LastList, w.clock.Synced = start, true
	case stepCatchUp:
		// Everything that changed before start is found by the listing and
		// the revisions; polls go on from there, and the operations up to
		// start are marked seen, so that the next poll does not count them
		// as new (and want another catch-up).
		undo, err := w.feed.baseline(ctx)
		if err == nil {
			err = w.list(ctx, false)
		}
		if err == nil {
			err = w.sweep(ctx)
		}
		if err != nil {
			undo()
			return err
		}
		w.clock.LastList, w.clock.LastSweep, w.clock.LastCatchUp = start, start, start
		w.clock.CatchUpWanted = false
		w.clock.ResweepAt = start.Add(w.opts.ReadLag)
		w.clock.ResweepAgainAt = start.Add(w.opts.OperationWait + w.opts.ReadLag)
		if w.clock.LastPoll.Before(start) {
			w.clock.LastPoll = start
		}
	case stepSweep:
		if err := w.sweep(ctx); err != nil {
			return err
		}
		w.clock.LastSweep, w.clock.ResweepAt, w.clock.ResweepAgainAt = start, w.clock.ResweepAgainAt, time.Time{}
	default:
		return w.feed.poll(ctx)
	}
	return nil
}

// list reads every HTTP namespace and service: services gone from a
// complete listing are gone; with all set, every service is read.
func (w *Watcher) list(ctx context.Context, all bool) error {
	listed := map[registry.Key]bool{}
	if err := w.b.eachService(ctx, w.b.rememberNamespace, func(key registry.Key, ref string) error {
		w.b.remember(key, ref)
		listed[key] = true
		_, read := w.revisions[key]
		if _, pending := w.dirty[key]; all || (!read && !pending) {
			w.dirty[key] = time.Time{} // new, or never read
		}
		return nil
	}); err != nil {
		return err
	}
	// A service missing from the listing is read again: only reads that
	// confirm its absence remove its imports.
	for key := range w.exported {
		if _, pending := w.dirty[key]; !listed[key] && !pending {
			w.dirty[key] = time.Time{}
		}
	}
	return nil
}

// sweep compares every known service's revision with the last one read
// (DiscoverInstancesRevision, a data-plane call) and marks those that
// changed. A failed check marks its service too: the read decides.
func (w *Watcher) sweep(ctx context.Context) error {
	for key, rev := range w.revisions {
		if _, pending := w.dirty[key]; pending {
			continue
		}
		out, err := w.b.c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
			NamespaceName: aws.String(key.Namespace), ServiceName: aws.String(key.Name), OwnerAccount: w.b.tenancy.ownerAccount(),
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil || aws.ToInt64(out.InstancesRevision) != rev {
			w.changed(key, time.Now())
		}
	}
	return nil
}

// fetchDirty reads the services marked changed whose time has come. A
// failed read is retried with a backoff of its own; a read that finds an
// exported service gone is confirmed by another ConfirmAbsence later.
func (w *Watcher) fetchDirty(ctx context.Context) {
	now := time.Now()
	for key, notBefore := range w.dirty {
		if now.Before(notBefore) {
			continue
		}
		rd, err := w.fetch(ctx, key)
		exports, rev := rd.exports, rd.rev
		var backoff time.Duration
		if err != nil {
			backoff = w.backoff.When(key)
		}
		result, at := afterRead(now, err != nil, !rd.same && len(exports) == 0, w.exported[key], w.absent[key], backoff, w.opts)
		if result == readRetry {
			w.dirty[key] = at
			w.b.o.Log.Error(err, "reading a Cloud Map service failed; its import stays as it is", "service", key.String(), "retryIn", backoff)
			w.sink.Unreadable(key)
			w.unreadable[key] = true
			continue
		}
		w.backoff.Forget(key) // the read succeeded
		if result == readConfirm {
			if w.absent[key].IsZero() {
				w.absent[key] = now
			}
			w.dirty[key] = at
			continue
		}
		if w.unreadable[key] {
			// The sink must hear the answer, whatever it is.
			delete(w.unreadable, key)
			w.exported[key] = true
		}
		delete(w.absent, key)
		delete(w.dirty, key)
		if (rd.same || exports != nil) && !w.settled(key, rev, now) {
			continue
		}
		if !rd.same {
			w.b.o.Usage.observe(w.b.region(), key, rd.holders)
		}
		switch {
		case rd.same:
			w.revisions[key] = rev
			continue // what the sink last heard
		case exports == nil:
			delete(w.settling, key)
			delete(w.revisions, key)
			delete(w.reported, key)
			w.decoded.forget(key)
		default:
			w.revisions[key] = rev
			if len(exports) > 0 {
				w.reported[key] = rd.sum
			} else {
				delete(w.reported, key)
			}
		}
		w.report(key, exports)
	}
}

func (w *Watcher) report(key registry.Key, exports []registry.Export) {
	if len(exports) == 0 {
		if !w.exported[key] {
			return
		}
		delete(w.exported, key)
	} else {
		w.exported[key] = true
	}
	for _, e := range exports {
		w.exporters[e.Cluster] = true
	}
	w.sink.Set(key, exports)
}

// read is what fetch read of a service: its exports (nil when Cloud Map
// says the service or namespace does not exist) at revision rev, from
// records of sum; same when those are the records last reported, which
// fetch then neither decodes nor returns.
type read struct {
	exports []registry.Export
	rev     int64
	sum     uint64
	same    bool
	// holders count the instances read by holder (holder), for Usage
	// once the read stands: one that went back past the revision held
	// is not what the service holds.
	holders map[string]int
}

// fetch reads one service's exports in this clusterset.
func (w *Watcher) fetch(ctx context.Context, key registry.Key) (read, error) {
	out, err := w.b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(key.Namespace), ServiceName: aws.String(key.Name), HealthStatus: types.HealthStatusFilterAll,
		QueryParameters: map[string]string{recordfmt.AttrClusterSetID: w.b.o.ClusterSet}, MaxResults: aws.Int32(recordfmt.MaxInstances),
		OwnerAccount: w.b.tenancy.ownerAccount(),
	})
	var gone *types.NamespaceNotFound
	if w.b.tenancy.shared() && errors.As(err, &gone) {
		// Unshared, or deleted: this account cannot tell which, so what
		// was imported stays (services are withdrawn before their
		// namespace goes, so a deletion was read as such before).
		return read{}, &registry.NotSharedError{Namespace: key.Namespace, Owner: w.b.o.Owner, Account: w.b.o.Account}
	}
	if isNotFound(err) {
		return read{}, nil
	}
	if err != nil {
		return read{}, err
	}
	instances := make([]recordfmt.Instance, len(out.Instances))
	for i, in := range out.Instances {
		instances[i] = recordfmt.Instance{ID: aws.ToString(in.InstanceId), Attrs: in.Attributes}
	}
	rd := read{rev: aws.ToInt64(out.InstancesRevision), sum: w.decoded.sum(instances)}
	if held, ok := w.reported[key]; ok && held == rd.sum && !w.unreadable[key] {
		rd.same = true
		return rd, nil
	}
	kept, creators, err := w.b.refuseForeign(ctx, key, instances)
	// Who holds the service's instances: the cluster they claim and,
	// across accounts, the account that wrote them (a squatter writes
	// under any name; none known when that listing failed).
	holders := map[string]int{}
	for _, in := range instances {
		holders[holder(in.Attrs[recordfmt.AttrClusterID], creators[in.ID])]++
	}
	rd.holders = holders
	if err != nil {
		return read{}, err
	}
	instances = kept
	w.b.checkWriter(key, func(yield func(recordfmt.Attrs) bool) {
		for _, in := range instances {
			if !yield(in.Attrs) {
				return
			}
		}
	})
	w.propagated(key, instances)
	var decoded []registry.Export
	var refused []registry.InvalidRecord
	if w.b.o.DecodeWhole {
		decoded, refused = recordfmt.DecodeAt(key, instances, time.Now(), w.b.maxImportEndpoints())
	} else {
		decoded, refused = w.decoded.decode(key, instances, time.Now())
	}
	if len(refused) > 0 && w.b.due("refused "+key.String()) {
		// Records of no export: no import here to say it on.
		w.b.o.Log.Error(nil, "refused records that make no export: they are not the cluster's they claim (their instance ids are another's), or invalid; a forged or corrupted record: deregister it",
			"service", key.String(), "records", refused)
	}
	exports := decoded
	for i := range exports {
		exports[i].Region = w.b.region()
		exports[i].Silent = w.alive.silentSince(exports[i].Cluster)
	}
	if exports == nil {
		exports = []registry.Export{}
	}
	rd.exports = exports
	return rd, nil
}

// propagated reports, for each other cluster's instance whose registration
// is new since the last read (and since this watcher started: the first
// read of an old export measures nothing), how long it took to arrive.
func (w *Watcher) propagated(key registry.Key, instances []recordfmt.Instance) {
	if f, ok := w.b.o.Observer.(registry.ObserverFuncs); ok && f.OnPropagated == nil {
		return // nobody measures it: no memory of instances kept for it
	}
	now, before := time.Now(), w.written[key]
	seen := map[string]string{}
	for _, in := range instances {
		v := in.Attrs[recordfmt.AttrWritten]
		if v == "" || in.Attrs[recordfmt.AttrClusterID] == w.b.o.Cluster {
			continue
		}
		seen[in.ID] = v
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || before[in.ID] == v {
			continue
		}
		if at := time.UnixMilli(ms); at.After(w.started) {
			w.b.o.Observer.Propagated(now.Sub(at))
		}
	}
	if len(seen) == 0 {
		delete(w.written, key)
	} else {
		w.written[key] = seen
	}
}
