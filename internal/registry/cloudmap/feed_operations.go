package cloudmap

import (
	"context"
	"maps"
	"time"

	"golang.org/x/time/rate"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// operationsFeed is the change feed in one account: the instance
// operations ListOperations shows, this cluster's own named by the
// backend, foreign ones attributed one GetOperation at a time.
type operationsFeed struct {
	*Watcher
	seen    map[string]time.Time // operation ids already handled, and when first
	lookups *rate.Limiter        // the budget of GetOperation attributions
	// Foreign operations are attributed without asking twice: services
	// found outside the HTTP namespaces, and namespaces by id.
	elsewhere map[string]bool
	nsByID    map[string]*types.Namespace
	// proofsWanted: a record was written since the last read of them.
	proofsWanted bool
	// changeRecords tell what changed in a clusterset too large for every
	// importer to look up every operation (byRecords); recordsOn: their
	// marks are current.
	changeRecords *recordsFeed
	recordsOn     bool
}

func newOperationsFeed(w *Watcher) *operationsFeed {
	return &operationsFeed{Watcher: w, seen: map[string]time.Time{}, elsewhere: map[string]bool{}, nsByID: map[string]*types.Namespace{},
		lookups: rate.NewLimiter(rate.Limit(w.opts.GetOperationRate), w.opts.MaxGetOperations), changeRecords: newRecordsFeed(w)}
}

// lookupCalls is the GetOperation calls a second that the importers of a
// one-account clusterset may make together: half the profile's assumed
// 50/s per operation and account (AWS publishes none). Every importer
// looks up every foreign operation of the account, other tenants' too:
// at 50 clusters and one tenant operation a second that alone is 49
// calls a second, and measured, changes took 10 to 90 s to reach every
// importer (BenchmarkFleet, docs/scale.md).
const lookupCalls = 25

// byRecords says the clusterset is too large for its importers to look
// up foreign operations (more than lookupCalls / GetOperationRate
// clusters, 5 at the shipped settings): the clusters' change records
// (one data-plane DiscoverInstancesRevision a poll, and a DiscoverInstances
// when they moved) say which services changed, as across accounts. Not
// while a cluster that exports writes no record (an older release, the
// AWS controller): its changes show only as operations.
func (f *operationsFeed) byRecords() bool {
	if float64(f.clock.Pollers)*f.opts.GetOperationRate <= lookupCalls {
		return false
	}
	writers := map[string]bool{f.b.o.Cluster: true}
	for _, in := range f.records { // as last read, by either feed
		writers[in.Attributes[recordfmt.AttrClusterID]] = true
	}
	for c := range f.exporters {
		if !writers[c] {
			return false
		}
	}
	return true
}

func (f *operationsFeed) baseline(ctx context.Context) (func(), error) {
	passed, err := f.operations(ctx, true)
	f.proofsWanted = true // operations taken as read may have been heartbeats
	undoRecords := func() {}
	if err == nil && f.recordsOn {
		undoRecords, err = f.changeRecords.baseline(ctx)
	}
	return func() {
		// The next poll finds them new again, and looks them up.
		for _, id := range passed {
			delete(f.seen, id)
		}
		undoRecords()
	}, err
}

// poll reads the instance operations that succeeded since the
// last successful poll and marks their services for reading. Operations
// this cluster started name their service; foreign ones are looked up one
// by one within the lookup budget; past it, they ask for a catch-up, and
// the newest are looked up with what the budget has left.
func (f *operationsFeed) poll(ctx context.Context) error {
	foreign, err := f.operations(ctx, false)
	if err != nil {
		return err
	}
	now := f.clock.Now
	switch large := f.byRecords(); {
	case large && f.recordsOn:
		// What changed is in the records; the operations only said
		// when (and ended this cluster's own).
		return f.changeRecords.read(ctx, false)
	case large:
		// Where each record stands now; this poll's operations are
		// still looked up below.
		if err := f.changeRecords.read(ctx, true); err != nil {
			return err
		}
		f.recordsOn = true
	default:
		f.recordsOn = false
	}
	if len(foreign) > 0 && !f.lookups.AllowN(now, len(foreign)) {
		// Past the budget: a catch-up finds them all. Meanwhile the
		// newest (the listing's order) are looked up with what the budget
		// has left, so that a change made while catch-ups fail (throttled)
		// is still heard by the polls.
		f.clock.CatchUpWanted = true
		left := min(int(f.lookups.TokensAt(now)), len(foreign))
		if left <= 0 || !f.lookups.AllowN(now, left) {
			return nil
		}
		foreign = foreign[:left]
	}
	for i, id := range foreign {
		key, err := f.operationKey(ctx, id)
		if err != nil {
			// The rest are looked up again by the next poll.
			for _, id := range foreign[i:] {
				delete(f.seen, id)
			}
			return err
		}
		if key != (registry.Key{}) {
			f.heard(key, now)
		}
		if key != (registry.Key{}) && key.Namespace != ChangesNamespace(f.b.o.ClusterSet) {
			// A change of the clusterset's, not another tenant's write nor
			// a heartbeat (both come all the time, and would keep every
			// idle cluster polling fast): its burst's tail comes soon.
			f.clock.LastChange = now
		}
	}
	if f.proofsWanted || now.Sub(f.proofsAt) >= f.opts.ProofReadInterval {
		f.readProofs(ctx, now)
	}
	return nil
}

// heard takes in that an operation changed key: a cluster's record (its
// own too, as a withdrawal's) is read as a proof, never as an export.
func (f *operationsFeed) heard(key registry.Key, now time.Time) {
	if key.Namespace == ChangesNamespace(f.b.o.ClusterSet) {
		f.proofsWanted = true // a cluster proved alive: read it now
		return
	}
	f.changed(key, now)
}

// readProofs reads the clusters' records when their service's revision
// moved (one data-plane call otherwise) and judges; a failed read judges
// nothing, and is tried again at the next poll.
func (f *operationsFeed) readProofs(ctx context.Context, now time.Time) {
	rev, err := f.b.c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
		NamespaceName: aws.String(ChangesNamespace(f.b.o.ClusterSet)), ServiceName: aws.String(ChangesService),
	})
	if isNotFound(err) {
		f.proofsWanted, f.proofsAt = false, now
		f.proved(now, nil, -1, nil)
		return
	}
	if err == nil && aws.ToInt64(rev.InstancesRevision) == f.recordRev {
		f.proofsWanted, f.proofsAt = false, now
		f.proved(now, f.records, f.recordRev, nil)
		return
	}
	var out *sd.DiscoverInstancesOutput
	if err == nil {
		out, err = f.b.readRecords(ctx)
	}
	if err != nil {
		f.b.o.Log.Error(err, "reading the clusters' proofs of life failed; nobody is drained or restored until a read answers", "retryIn", f.opts.PollInterval)
		return
	}
	f.proofsWanted, f.proofsAt = false, now
	if out == nil {
		f.proved(now, nil, -1, nil)
		return
	}
	f.proved(now, out.Instances, aws.ToInt64(out.InstancesRevision), nil)
}

// operations reads the instance operations that finished since the last
// poll, newest first, marks them seen, queues the services of this
// cluster's own (telling the backend which failed), and returns the
// foreign ones that succeeded (a baseline only takes them as read).
//
// Cloud Map pages before it filters, over every operation of the account
// (ECS's and other tools' too), so no filter bounds a poll; the order does.
// Operations come newest first by creation, so a poll reads pages until one
// holds an operation that an earlier poll, at least an Overlap after the
// operation was first seen, read past: everything after it was created
// before it, so had ended by then (Overlap bounds how long an operation
// runs; one that runs longer is left to the listing and the sweep), and
// was read then. Measured from the last poll, not the clock: after a gap
// in polling (throttled calls, a long catch-up) the polls before it may
// have passed over an operation still running, which only this one lists.
// Past MaxPollPages without one, it asks for a catch-up instead.
func (f *operationsFeed) operations(ctx context.Context, baseline bool) (foreign []string, err error) {
	now, last := f.clock.Now, f.clock.LastPoll
	pages := sd.NewListOperationsPaginator(f.b.c, &sd.ListOperationsInput{Filters: []types.OperationFilter{
		{Name: types.OperationFilterNameStatus, Condition: types.FilterConditionIn, Values: []string{
			string(types.OperationStatusSuccess), string(types.OperationStatusFail)}},
		{Name: types.OperationFilterNameType, Condition: types.FilterConditionIn, Values: []string{
			string(types.OperationTypeRegisterInstance), string(types.OperationTypeDeregisterInstance)}},
	}})
	seen := map[string]time.Time{}
	// A catch-up right after polls (too many foreign operations to look
	// up) keeps what they saw, with when: the polls after it page past its
	// marks as before, and find an operation created before them that was
	// still running then. After a gap, or at the first listing, what the
	// catch-up marks is where they stop.
	recent := baseline && !last.IsZero() && now.Sub(last) <= f.opts.MaxLookback
	if recent {
		maps.Copy(seen, f.seen)
	}
	var fresh []types.OperationSummary
	read, found := 0, false
	for !found && pages.HasMorePages() {
		if read == f.opts.MaxPollPages {
			// A catch-up costs less than more pages (a baseline is one).
			// Not when the change records say what changed: the
			// operations only end this cluster's own writes then (those
			// not seen to end are written again, expireOwnOps), and a
			// catch-up per poll during a bulk export took every importer's
			// data-plane budget (a revision call per known service, three
			// times).
			f.clock.CatchUpWanted = f.clock.CatchUpWanted || !baseline && !f.recordsOn
			break
		}
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		read++
		for _, op := range page.Operations {
			id := aws.ToString(op.Id)
			first, known := f.seen[id]
			if known && last.Sub(first) >= f.opts.Overlap {
				seen[id], found = first, true
				break
			}
			if baseline {
				// Taken as read (the listing reads every service), and a
				// mark for the polls after; this cluster's own are still
				// told to the backend below (a late failure among them
				// must be written again).
				if !known {
					fresh = append(fresh, op)
					first = now
				}
				if !recent {
					first = time.Time{} // the polls after stop here
				}
				seen[id], found = first, true
				continue
			}
			if !known {
				first = now
				fresh = append(fresh, op)
			}
			seen[id] = first
		}
	}
	f.b.o.Observer.PollPages(read)
	f.seen = seen
	for _, op := range fresh {
		id := aws.ToString(op.Id)
		failed := op.Status == types.OperationStatusFail
		if mine, own := f.b.takeOwnOp(id); own {
			// Read back, without polling faster: this cluster's own writes
			// are read back anyway (Backend.reread), and fast polls during
			// its bulk export would take the budget its writes need.
			f.heard(mine.key, now)
			f.b.opFinished(ctx, id, mine.key, mine.started, failed, nil)
			continue
		}
		if !failed {
			foreign = append(foreign, id)
		}
	}
	f.clock.LastPoll = now
	// An operation of ours not seen finish by now was missed.
	f.b.expireOwnOps(now.Add(-10 * f.opts.Overlap))
	return foreign, nil
}

// operationKey finds the service a foreign operation changed.
func (f *operationsFeed) operationKey(ctx context.Context, opID string) (registry.Key, error) {
	out, err := f.b.c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(opID)})
	if err != nil {
		return registry.Key{}, err
	}
	svcID := out.Operation.Targets[string(types.OperationTargetTypeService)]
	key, known := f.b.keyOf(svcID)
	if known {
		return key, nil
	}
	if f.elsewhere[svcID] {
		return registry.Key{}, nil
	}
	svc, err := f.b.c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(svcID)})
	if isNotFound(err) {
		f.elsewhere[svcID] = true // deleted, or not one this account may read
		return registry.Key{}, nil
	}
	if err != nil {
		return registry.Key{}, err
	}
	ns, err := f.namespace(ctx, aws.ToString(svc.Service.NamespaceId))
	if isNotFound(err) {
		return registry.Key{}, nil
	}
	if err != nil {
		return registry.Key{}, err
	}
	if ns.Type != types.NamespaceTypeHttp {
		// A DNS registration (clustermap's --cloudmap-dns, ECS): its next
		// operations cost a GetOperation only.
		if len(f.elsewhere) >= maxElsewhere {
			clear(f.elsewhere)
		}
		f.elsewhere[svcID] = true
		return registry.Key{}, nil
	}
	key = registry.Key{Namespace: aws.ToString(ns.Name), Name: aws.ToString(svc.Service.Name)}
	f.b.remember(key, svcID)
	return key, nil
}

// maxElsewhere bounds the memory of services outside the MCS namespaces.
const maxElsewhere = 10000

// namespace reads a namespace by id, once: an id names one namespace for
// good.
func (f *operationsFeed) namespace(ctx context.Context, id string) (*types.Namespace, error) {
	if ns, ok := f.nsByID[id]; ok {
		return ns, nil
	}
	out, err := f.b.c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(id)})
	if err != nil {
		return nil, err
	}
	f.nsByID[id] = out.Namespace
	return out.Namespace, nil
}
