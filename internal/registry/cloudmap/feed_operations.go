package cloudmap

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry"
)

// operationsFeed is the change feed in one account: the instance
// operations ListOperations shows, this cluster's own named by the
// backend, foreign ones attributed one GetOperation at a time.
type operationsFeed struct {
	*Watcher
	seen     map[string]time.Time // operation ids already handled
	lastFull time.Time            // last poll with the whole overlap
	lookups  *rate.Limiter        // the budget of GetOperation attributions
	// Foreign operations are attributed without asking twice: services
	// found outside the HTTP namespaces, and namespaces by id.
	elsewhere map[string]bool
	nsByID    map[string]*types.Namespace
	// proofsWanted: a record was written since the last read of them.
	proofsWanted bool
}

func newOperationsFeed(w *Watcher) *operationsFeed {
	return &operationsFeed{Watcher: w, seen: map[string]time.Time{}, elsewhere: map[string]bool{}, nsByID: map[string]*types.Namespace{},
		lookups: rate.NewLimiter(rate.Limit(w.opts.GetOperationRate), w.opts.MaxGetOperations)}
}

func (f *operationsFeed) baseline(ctx context.Context) error {
	_, err := f.operations(ctx)
	f.proofsWanted = true // operations taken as read may have been heartbeats
	return err
}

func (f *operationsFeed) caughtUp(at time.Time) { f.lastFull = at }

// poll reads the instance operations that succeeded since the
// last successful poll and marks their services for reading. Operations
// this cluster started name their service; foreign ones are looked up one
// by one within the lookup budget; past it, they ask for a catch-up.
func (f *operationsFeed) poll(ctx context.Context) error {
	foreign, err := f.operations(ctx)
	if err != nil {
		return err
	}
	now := f.clock.Now
	if len(foreign) > 0 {
		f.clock.LastChange = now
	}
	if len(foreign) > 0 && !f.lookups.AllowN(now, len(foreign)) {
		f.clock.CatchUpWanted = true
		return nil
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
		switch {
		case key.Namespace == ChangesNamespace(f.b.o.ClusterSet):
			f.proofsWanted = true // a cluster proved alive: read it now
		case key != (registry.Key{}):
			f.dirty[key] = time.Time{}
		}
	}
	if f.proofsWanted || now.Sub(f.proofsAt) >= f.opts.ProofReadInterval {
		f.readProofs(ctx, now)
	}
	return nil
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
		f.proved(now, nil, -1)
		return
	}
	if err == nil && aws.ToInt64(rev.InstancesRevision) == f.recordRev {
		f.proofsWanted, f.proofsAt = false, now
		f.proved(now, f.records, f.recordRev)
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
		f.proved(now, nil, -1)
		return
	}
	f.proved(now, out.Instances, aws.ToInt64(out.InstancesRevision))
}

// operations lists the successful instance operations of the poll window
// not seen before, marks them seen and the poll done, queues the services
// of this cluster's own, and returns the foreign ones.
func (f *operationsFeed) operations(ctx context.Context) (foreign []string, err error) {
	now := f.clock.Now
	from, full := pollFrom(f.clock, f.lastFull, f.opts)
	pages := sd.NewListOperationsPaginator(f.b.c, &sd.ListOperationsInput{Filters: []types.OperationFilter{
		{Name: types.OperationFilterNameStatus, Values: []string{string(types.OperationStatusSuccess)}},
		{Name: types.OperationFilterNameType, Condition: types.FilterConditionIn, Values: []string{
			string(types.OperationTypeRegisterInstance), string(types.OperationTypeDeregisterInstance)}},
		{Name: types.OperationFilterNameUpdateDate, Condition: types.FilterConditionBetween, Values: []string{
			fmt.Sprint(from.Unix()), fmt.Sprint(now.Add(time.Hour).Unix())}},
	}})
	var ids []string
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, op := range page.Operations {
			ids = append(ids, aws.ToString(op.Id))
		}
	}
	for _, id := range ids {
		if _, done := f.seen[id]; done {
			continue
		}
		f.seen[id] = now
		if key, own := f.b.takeOwnOp(id); own {
			// Read back, without polling faster: this cluster's own writes
			// are read back anyway (Backend.reread), and fast polls during
			// its bulk export would take the budget its writes need.
			f.dirty[key] = time.Time{}
			continue
		}
		foreign = append(foreign, id)
	}
	f.clock.LastPoll = now
	if full {
		f.lastFull = now
	}
	// An operation seen more than an overlap (and the second the date
	// filter rounds down to) ago updated before any later window begins:
	// none lists it again. (A fast poll's own window is shorter: pruning
	// by it made the next full poll take operations for new; pruning
	// without the rounding second made this cluster's own operations
	// come back as foreign ones, a GetOperation each.)
	for id, t := range f.seen {
		if now.Sub(t) > f.opts.Overlap+time.Second {
			delete(f.seen, id)
		}
	}
	// An operation of ours not seen succeed by now failed, or was missed.
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
