// Package cloudmap is the Registry on AWS Cloud Map. One HTTP namespace per
// Kubernetes namespace, one Cloud Map service per exported Service, one
// instance per endpoint address and port with the attribute schema of the
// AWS Cloud Map MCS controller (so both controllers share a clusterset), and
// one service record instance per exporting cluster carrying what that
// schema lacks (all ports, session affinity, IP families, exported labels
// and annotations) and keeping a zero-endpoint export visible. The record
// format itself is package recordfmt.
package cloudmap

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// TagClusterSet names the clusterset a namespace or service was created
// for, beside clustermap's mark (cloudmapclient.Marked); only what carries
// both, for this clusterset, is ever deleted.
const TagClusterSet = "clustermap.io/clusterset"

// Options configure one cluster's Backend.
type Options struct {
	ClusterSet, Cluster string
	// Controller names the writer on the records (K8S_CONTROLLER).
	Controller string
	Log        logr.Logger
	// RecordVersion is the record format Publish writes (default: this
	// release's); an earlier one lets tests run a cluster as an older
	// release would.
	RecordVersion int
	// Formats, when set, chooses between packed and per-endpoint records
	// (recordfmt.Formats); unset, the per-endpoint format is written.
	Formats *recordfmt.Formats
	// Usage, when set, holds the clusterset's instances against Cloud
	// Map's quotas (usage.go); unset, only this cluster's are counted.
	Usage *Usage
	// Owner, when set, is the AWS account that owns the clusterset's
	// namespaces, shared through AWS RAM with every member account, this
	// cluster's (Account) included; empty: the clusterset lives in one
	// account, this cluster's. See tenancy.go.
	Owner, Account string
	// Watch tunes Watch.
	Watch WatchOptions
	// Observer, when set, hears what the backend sees: each read, proofs
	// of life and drained clusters (liveness.go), how long others'
	// changes took to arrive (from AttrWritten), the change feed's pages,
	// duplicate and foreign records (identity.go, accounts.go), exports
	// kept packed, and writes that failed late.
	Observer registry.Observer
	// Writer is this installation's mark (WriterMark) on its service
	// records, by which another installation's records under this
	// cluster's id are told apart (identity.go). No mark, no check.
	Writer string
	// DecodeWhole decodes every read of a service whole, keeping no
	// decode between reads. The cache it turns off holds the exports the
	// controller's import view holds anyway; a benchmark running many
	// clusters' registry sides in one process, which keep no view, would
	// hold every cluster's copy.
	DecodeWhole bool
	// MaxImportEndpoints caps the endpoint records read of each cluster's
	// export of a service (default registry.DefaultMaxImportEndpoints):
	// the export is cut there and says so (registry.Export.Capped).
	MaxImportEndpoints int
}

// Backend is the Cloud Map Registry of one cluster.
type Backend struct {
	c       *sd.Client
	o       Options
	tenancy tenancy
	owner   ownership

	mu sync.Mutex
	// Cloud Map names namespaces and services by id, or by ARN (refs),
	// which another account's resources need.
	namespaces map[string]string       // Kubernetes namespace -> Cloud Map namespace ref
	services   map[registry.Key]string // -> Cloud Map service ref
	keys       map[string]registry.Key // Cloud Map service id -> key
	created    map[string]bool         // Cloud Map service refs this controller created: ours, no need to ask
	// ownOps are operations this cluster started, so that the change feed
	// knows their service without asking, or, in a shared namespace (and
	// under ConfirmWrites), confirmOwnOps asks how they ended; entries
	// never seen end expire, their services written again.
	ownOps map[string]ownOp
	// changed are services this cluster published or withdrew: the watcher
	// reads them again at once.
	changed chan registry.Key
	// checks are services this cluster imports that the watcher is asked
	// to read as known exports (Check).
	checks chan registry.Key
	// record is this cluster's change record: its changes across accounts,
	// and its proof of life in every mode (liveness.go); recordMu keeps a
	// write of it and its retirement apart.
	record   *changeLog
	recordMu sync.Mutex
	// exporting are the services this cluster published and did not
	// withdraw since it started.
	exporting map[registry.Key]bool
	// unshared are the namespaces a member last found not shared with it.
	unshared  map[string]time.Time
	nsLookups singleflight.Group
	// reported are when each identity problem was last reported
	// (identity.go); bound is the account each cluster's records must be
	// created by, across accounts (accounts.go).
	reported map[string]time.Time
	bound    map[string]string
	// failed are the services whose records a write of this cluster's
	// failed after Cloud Map accepted it, not made good since.
	failed map[registry.Key]lateFailure
	// recent are this cluster's writes of its records within the read
	// lag (withRecent).
	recent map[registry.Key]map[string]recentWrite
	// registering are the registrations of a publish whose replaced
	// records wait for them to finish (registered).
	registering map[registry.Key]registrations
	// tried are the records this cluster added to each export since it was
	// last published whole (pastWhole).
	tried map[registry.Key][]string
	// emptied are the namespaces (name -> id) whose last service this
	// cluster deleted, and that are not yet deleted in turn: the service
	// that brought a withdrawal to them is gone (withdraw).
	emptied map[string]string
}

// lateFailure is an operation of this cluster's that ended FAIL.
type lateFailure struct {
	at         time.Time
	op, reason string
}

type ownOp struct {
	key     registry.Key
	started time.Time
}

// New returns the backend for one cluster of a clusterset.
func New(c *sd.Client, o Options) *Backend {
	if o.Observer == nil {
		o.Observer = registry.ObserverFuncs{}
	}
	t := tenancy{owner: o.Owner, account: o.Account}
	return &Backend{
		c: c, o: o, tenancy: t, owner: t.ownership(c, o.ClusterSet),
		namespaces: map[string]string{}, services: map[registry.Key]string{}, keys: map[string]registry.Key{},
		ownOps: map[string]ownOp{}, created: map[string]bool{}, changed: make(chan registry.Key, 1024), checks: make(chan registry.Key, 1024),
		record: newChangeLog(), unshared: map[string]time.Time{}, exporting: map[registry.Key]bool{},
		failed: map[registry.Key]lateFailure{}, recent: map[registry.Key]map[string]recentWrite{},
		registering: map[registry.Key]registrations{}, tried: map[registry.Key][]string{}, emptied: map[string]string{},
	}
}

// unsharedMemory is how long a namespace found not shared is taken as
// such without asking again.
const unsharedMemory = 5 * time.Second

// Watch reads Cloud Map's changes into sink until ctx ends, and writes
// this cluster's change record once it exports.
func (b *Backend) Watch(ctx context.Context, sink registry.Sink) error {
	go b.writeChanges(ctx)
	go b.confirmOwnOps(ctx, b.tenancy.confirmAfter())
	w := newWatcher(b, sink)
	return w.Start(ctx)
}

// ConfirmWrites asks how this cluster's writes ended until ctx ends, for a
// Backend that publishes without watching: a watcher's change feed tells
// it otherwise. A write that failed later is reported to the Observer.
func (b *Backend) ConfirmWrites(ctx context.Context) { b.confirmOwnOps(ctx, confirmAfter) }

// reread asks the watcher to read a service again now, and tells the
// others through the change record: other accounts, and in one account
// the importers of a clusterset too large to look up every operation
// (operationsFeed.byRecords).
func (b *Backend) reread(key registry.Key) {
	b.record.note(key)
	select {
	case b.changed <- key:
	default: // full: the next poll finds the change anyway
	}
}

// Check asks the watcher to read a service this cluster imports as a
// known export; when the queue is full the caller asks again later.
func (b *Backend) Check(key registry.Key) {
	select {
	case b.checks <- key:
	default:
	}
}

var _ registry.Registry = (*Backend)(nil)

// Publish registers what this cluster's export lacks and deregisters what it
// no longer has: new records first, so that a service never goes empty
// while it changes.
//
// A write Cloud Map accepted and failed later (WriteFailure) was written
// again by this publish; it is reported until a later write succeeds.
func (b *Backend) Publish(ctx context.Context, e registry.Export) error {
	err := b.publish(ctx, e)
	if errors.Is(err, ErrPending) {
		// Written again meanwhile; the export must say why it waits.
		if late := b.WriteFailure(e.Key); late != nil {
			return late
		}
	}
	if err == nil {
		b.mu.Lock()
		b.exporting[e.Key] = true
		b.mu.Unlock()
		if b.tenancy.exportsProveAlive() {
			// A withdrawal must not bring it back (retireRecord).
			b.record.alive()
		}
		b.reread(e.Key)
		err = b.WriteFailure(e.Key)
	}
	return err
}

func (b *Backend) publish(ctx context.Context, e registry.Export) error {
	version := b.o.RecordVersion
	if version == 0 {
		version = recordfmt.RecordVersion
	}
	// The format is known once this cluster's records are read: what no
	// format can hold (the service record's limits) is refused before.
	var desired map[string]recordfmt.Attrs
	var err error
	if b.mayPack(version) {
		_, err = recordfmt.ServiceRecord(e, b.o.Controller, version)
	} else {
		desired, err = recordfmt.Encode(e, b.o.Controller, version)
	}
	if err != nil {
		return err
	}
	nsID, err := b.ensureNamespace(ctx, e.Namespace)
	if err != nil {
		return err
	}
	svcID, err := b.ensureService(ctx, nsID, e.Key)
	if err != nil {
		return err
	}
	current, err := b.ownInstances(ctx, e.Key)
	if err != nil {
		return err
	}
	b.checkWriter(e.Key, maps.Values(current))
	switch {
	case b.packs(version, current):
		desired, err = recordfmt.EncodePacked(e, b.o.Controller, current)
	case desired == nil:
		desired, err = recordfmt.Encode(e, b.o.Controller, version)
		if why := b.tooLarge(e.Key, current, desired, err); why != "" {
			// Per-endpoint records are chosen for clusters that read only
			// those; this export cannot be written so, and refusing it
			// would freeze it everywhere: packed, they lack it.
			if desired, err = recordfmt.EncodePacked(e, b.o.Controller, current); err == nil {
				b.keptPacked(e.Key, why)
			}
		}
	}
	if err != nil {
		return err
	}
	if rec := desired[recordfmt.ServiceRecordID(b.o.ClusterSet, b.o.Cluster)]; rec != nil && b.o.Writer != "" {
		rec[recordfmt.AttrWriter] = b.o.Writer
	}
	if len(desired) > len(current) {
		// Refused before anything is written: never a cluster half
		// registered.
		if why := b.o.Usage.fits(b.region(), e.Key, len(current), len(desired)); why != "" {
			// What earlier tries of this export added goes too.
			back := b.pastWhole(e.Key, nil)
			limit := &recordfmt.LimitError{Reason: why}
			if len(back) > 0 {
				// Refused midway (its registrations failed as they
				// applied): others fill the service too.
				limit.Retry = contendedRetry()
				if err := b.takeBack(ctx, svcID, e.Key, back); err != nil {
					return errors.Join(limit, err)
				}
			}
			return limit
		}
	}
	// The records an earlier publish registered go in before the ones they
	// replace go out: operations finish in any order.
	if done, err := b.registered(ctx, e.Key); err != nil || !done {
		return errors.Join(ErrPending, err)
	}
	changes := recordfmt.Diff(desired, current)
	register, deregister := changes.Register, changes.Deregister
	if len(register)+len(deregister) == 0 {
		// What a failed write was to make is there: written since by a
		// write that started before the failure was known.
		b.mu.Lock()
		delete(b.failed, e.Key)
		b.mu.Unlock()
	}
	// The service record says what the others hold: it goes in after
	// them, at the next publish (operations finish in any order, and a
	// read between would pair the new record with the old endpoints).
	later := false
	if rec := recordfmt.ServiceRecordID(b.o.ClusterSet, b.o.Cluster); register[rec] != nil && len(register) > 1 {
		delete(register, rec)
		later = true
	}
	written := strconv.FormatInt(time.Now().UnixMilli(), 10)
	writes := make([]cloudmapclient.Write, 0, len(register))
	for id, attrs := range register {
		attrs = maps.Clone(attrs)
		attrs[recordfmt.AttrWritten] = written
		writes = append(writes, cloudmapclient.Write{ID: id, Attributes: attrs})
	}
	var addedMu sync.Mutex
	var added []string
	stamps := map[string]string{}
	if err := cloudmapclient.WriteInstances(ctx, b.c, svcID, writes, func(i int, o cloudmapclient.Outcome) error {
		switch {
		case o.Full != "":
			return &recordfmt.LimitError{Reason: "Cloud Map refused an instance: " + o.Full}
		case o.Busy:
			// An earlier write of this record is still running: its
			// outcome comes first, then this one is written again.
			return ErrPending
		case o.NoService:
			// Another cluster removed the empty service meanwhile: the
			// retry creates it again.
			b.forget(e.Key)
		}
		if o.Err != nil {
			return fmt.Errorf("registering %s in %s: %w", writes[i].ID, e.Key, o.Err)
		}
		b.sent(e.Key, writes[i], o.Op)
		addedMu.Lock()
		defer addedMu.Unlock()
		stamps[writes[i].ID] = written
		if _, had := current[writes[i].ID]; !had {
			added = append(added, writes[i].ID)
		}
		return nil
	}); err != nil {
		// What went in counts as added whatever failed beside it (a
		// throttled call, a write still running): a refusal takes it back.
		added = b.pastWhole(e.Key, added)
		b.mu.Lock()
		b.tried[e.Key] = added
		b.mu.Unlock()
		var limit *recordfmt.LimitError
		if errors.As(err, &limit) {
			// Another writer filled the service meanwhile: what this
			// publish added goes again, and the export stays as it was.
			// Everything past the last whole export goes: earlier tries of
			// this one may have added records too.
			limit.Retry = contendedRetry()
			if undo := b.takeBack(ctx, svcID, e.Key, added); undo != nil {
				return errors.Join(limit, fmt.Errorf("taking back the %d instances this export added: %w", len(added), undo))
			}
			limit.Reason += fmt.Sprintf("; the %d instances this export had added were taken back: other clusters import it as before", len(added))
			return limit
		}
		return err
	}
	b.mu.Lock()
	b.tried[e.Key] = append(b.tried[e.Key], added...)
	b.mu.Unlock()
	if (later || len(deregister) > 0) && len(stamps) > 0 {
		// A service never goes without the records that replace the
		// ones leaving: those leave at a publish after these are in.
		b.mu.Lock()
		b.registering[e.Key] = registrations{stamps: stamps, at: time.Now()}
		b.mu.Unlock()
		return ErrPending
	}
	if err := b.deregister(ctx, svcID, e.Key, deregister); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.tried, e.Key) // whole now
	b.mu.Unlock()
	return nil
}

// contendedRetry is when an export Cloud Map refused midway is tried
// again: between half a minute and a minute and a half, at random. Clusters
// filling one service at once all meet its quota, and all take their
// records back; tried again at once, they would meet again. Spread, the
// first fills what it can, and the next to try reads that and, if it does
// not fit, is refused before it writes anything.
func contendedRetry() time.Duration {
	return 30*time.Second + rand.N(time.Minute)
}

// pastWhole are the records this cluster added to key since the export
// was last published whole: those of earlier tries, and added. Records of
// a whole export (another controller's before a restart too) are kept.
func (b *Backend) pastWhole(key registry.Key, added []string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return union(b.tried[key], added)
}

// registered tells whether the registrations a publish of key left
// waiting for (registering) are in: a read of this cluster's records shows
// each with the write stamp it was registered with (one data-plane call;
// no control-plane one, which a member account may not be allowed).
// Registrations not shown within registrationTimeout failed or were lost
// (the change feed tells of failures sooner, in one account): they are
// given up, with this cluster's memory of its writes of key, so that the
// next publish reads what is there and writes what is missing.
func (b *Backend) registered(ctx context.Context, key registry.Key) (bool, error) {
	b.mu.Lock()
	pending, waiting := b.registering[key]
	b.mu.Unlock()
	if !waiting {
		return true, nil
	}
	if time.Since(pending.at) > registrationTimeout {
		b.mu.Lock()
		delete(b.registering, key)
		delete(b.recent, key)
		b.mu.Unlock()
		return true, nil
	}
	out, err := b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(key.Namespace), ServiceName: aws.String(key.Name), HealthStatus: types.HealthStatusFilterAll,
		QueryParameters: map[string]string{recordfmt.AttrClusterID: b.o.Cluster, recordfmt.AttrClusterSetID: b.o.ClusterSet}, MaxResults: aws.Int32(recordfmt.MaxInstances),
		OwnerAccount: b.tenancy.ownerAccount(),
	})
	if err != nil {
		return false, err
	}
	shown := map[string]string{}
	for _, in := range out.Instances {
		shown[aws.ToString(in.InstanceId)] = in.Attributes[recordfmt.AttrWritten]
	}
	for id, stamp := range pending.stamps {
		if shown[id] != stamp {
			return false, nil
		}
	}
	b.mu.Lock()
	delete(b.registering, key)
	b.mu.Unlock()
	b.opFinished(ctx, "", key, pending.at, false, nil)
	return true, nil
}

// registrationTimeout is how long registrations are waited for before
// they are taken as failed: operations take seconds.
const registrationTimeout = 30 * time.Second

// registrations are a publish's registrations, by instance id with the
// write stamp (AttrWritten) each carries, and when it started them.
type registrations struct {
	stamps map[string]string
	at     time.Time
}

func (b *Backend) region() string { return b.c.Options().Region }

// Cluster is the cluster this backend publishes for.
func (b *Backend) Cluster() string { return b.o.Cluster }

// tooLarge says why an export encoded per endpoint (desired, or err) would
// not fit Cloud Map's quotas; "" when it fits, or is refused otherwise, or
// when per-endpoint records are asked for (--cloudmap-endpoint-records:
// callers read Cloud Map directly, and packed records would leave them
// nothing).
func (b *Backend) tooLarge(key registry.Key, current, desired map[string]recordfmt.Attrs, err error) string {
	if b.o.Formats == nil || b.o.Formats.PerEndpoint {
		return ""
	}
	var limit *recordfmt.LimitError
	if errors.As(err, &limit) {
		return limit.Reason
	}
	if err != nil || len(desired) <= len(current) {
		return ""
	}
	return b.o.Usage.fits(b.region(), key, len(current), len(desired))
}

// keptPacked says, once a while per service, that an export is written
// packed though some clusters read only per-endpoint records.
func (b *Backend) keptPacked(key registry.Key, why string) {
	if !b.due("kept packed " + key.String()) {
		return
	}
	c := b.o.Formats.Choose()
	msg := fmt.Sprintf("written in packed records though clusters %s read only per-endpoint records (%s): per endpoint it would not fit (%s); they import it once they upgrade", c.Behind, c.Why, why)
	b.o.Log.Info(msg, "service", key.String())
	b.o.Observer.KeptPacked(key, msg)
}

// mayPack tells whether this cluster may write packed records at all.
func (b *Backend) mayPack(version int) bool {
	return b.o.Formats != nil && version >= recordfmt.PackedVersion
}

// packs tells whether an export is written packed: as Formats chooses,
// and before the registry was read once, as it is written now.
func (b *Backend) packs(version int, current map[string]recordfmt.Attrs) bool {
	if !b.mayPack(version) {
		return false
	}
	if c := b.o.Formats.Choose(); c.Known {
		return c.Packed
	}
	return current[recordfmt.ServiceRecordID(b.o.ClusterSet, b.o.Cluster)][recordfmt.AttrEndpointFormat] == recordfmt.PackedFormat
}

// takeBack deregisters what a refused publish added, so that the export
// is refused whole: within registrationTimeout, sending again what a
// running registration (DuplicateRequest) or a failed call kept (clusters
// that meet a quota together also meet the account's call quota). Each
// round sends only the records still left: at a cluster's call budget,
// sending all of a large export again would outlast the timeout. The ids
// stay in tried, but those found gone: a later refusal takes back again
// what a read lagging behind, or a deregistration that failed late, left.
func (b *Backend) takeBack(ctx context.Context, svcID string, key registry.Key, ids []string) error {
	b.mu.Lock()
	b.tried[key] = union(b.tried[key], ids)
	b.mu.Unlock()
	left := ids
	for deadline := time.Now().Add(registrationTimeout); ; {
		kept, gone, running, err := b.deregisterSome(ctx, svcID, key, left)
		b.mu.Lock()
		b.tried[key] = slices.DeleteFunc(b.tried[key], func(id string) bool { return slices.Contains(gone, id) })
		b.mu.Unlock()
		if len(kept) == 0 || time.Now().After(deadline) {
			if running {
				err = errors.Join(ErrPending, err)
			}
			return err
		}
		left = kept
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// union is a's ids, then those of b not in a.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, id := range b {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// deregister removes instances; one already gone is fine. ErrPending: a
// write of one of them still runs.
func (b *Backend) deregister(ctx context.Context, svcID string, key registry.Key, ids []string) error {
	_, _, running, err := b.deregisterSome(ctx, svcID, key, ids)
	if running {
		return errors.Join(ErrPending, err)
	}
	return err
}

// deregisterSome removes instances and returns those left: kept by a
// running write of theirs (running: DuplicateRequest, not an error) or by
// a failed call (its error); and those Cloud Map has not (InstanceNotFound).
func (b *Backend) deregisterSome(ctx context.Context, svcID string, key registry.Key, ids []string) (kept, gone []string, running bool, err error) {
	ids, err = b.ownedOnly(ctx, key, ids)
	if err != nil {
		return nil, nil, false, err
	}
	left, missed := make([]bool, len(ids)), make([]bool, len(ids))
	var dups atomic.Bool
	writes := make([]cloudmapclient.Write, len(ids))
	for i, id := range ids {
		writes[i] = cloudmapclient.Write{ID: id}
	}
	err = cloudmapclient.WriteInstances(ctx, b.c, svcID, writes, func(i int, o cloudmapclient.Outcome) error {
		switch {
		case o.Missing:
			b.sent(key, writes[i], "")
			missed[i] = true
			return nil
		case o.Busy:
			left[i] = true
			dups.Store(true)
			return nil // a write of this record still runs
		case o.Err != nil:
			left[i] = true
			return fmt.Errorf("deregistering %s from %s: %w", ids[i], key, o.Err)
		}
		b.sent(key, writes[i], o.Op)
		return nil
	})
	for i, id := range ids {
		switch {
		case left[i]:
			kept = append(kept, id)
		case missed[i]:
			gone = append(gone, id)
		}
	}
	return kept, gone, dups.Load(), err
}

// Withdraw deregisters this cluster's records of a service, then deletes
// the Cloud Map service and namespace if clustermap created them and
// nothing else is left in them.
func (b *Backend) Withdraw(ctx context.Context, key registry.Key) error {
	err := b.withdraw(ctx, key)
	if err == nil || errors.Is(err, ErrPending) {
		b.reread(key)
	}
	if err == nil {
		b.mu.Lock()
		delete(b.tried, key)
		b.mu.Unlock()
		err = b.retireRecord(ctx, key)
	}
	return err
}

func (b *Backend) withdraw(ctx context.Context, key registry.Key) error {
	current, err := b.ownInstances(ctx, key)
	if err != nil {
		return err
	}
	if b.otherWriter(maps.Values(current)) != "" {
		// A twin (another installation under this cluster's id) wrote
		// these records last: they are its export, not this one's to
		// withdraw. Reported as a duplicate id.
		b.checkWriter(key, maps.Values(current))
		return nil
	}
	svcID, err := b.serviceID(ctx, key)
	if err != nil {
		return err
	}
	if svcID == "" {
		b.mu.Lock()
		nsID := b.emptied[key.Namespace]
		b.mu.Unlock()
		if nsID != "" {
			return b.deleteNamespace(ctx, key, nsID)
		}
		return nil
	}
	ids := make([]string, 0, len(current))
	for id := range current {
		ids = append(ids, id)
	}
	if err := b.deregister(ctx, svcID, key, ids); err != nil {
		return err
	}
	if len(ids) > 0 {
		// Deregistering is asynchronous: the service cannot be empty yet.
		// Asking now would cost two calls to learn that.
		return ErrPending
	}
	return b.cleanup(ctx, key, svcID)
}

// ErrPending says an asynchronous Cloud Map change has not finished yet.
var ErrPending = registry.ErrPending

func (b *Backend) cleanup(ctx context.Context, key registry.Key, svcID string) error {
	svc, err := b.c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(svcID)})
	if isNotFound(err) {
		b.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	if n := aws.ToInt32(svc.Service.InstanceCount); n > 0 {
		// Other clusters' records remain (then the service stays), or our
		// deregistrations are still running (then come back), or they
		// have just finished (then the service goes).
		ours, others, err := b.listRecords(ctx, svcID)
		switch {
		case err != nil:
			return err
		case ours:
			return ErrPending
		case others:
			return nil
		}
	}
	b.mu.Lock()
	mine := b.created[svcID]
	b.mu.Unlock()
	if !mine {
		if mine, err = b.owner.createdService(ctx, svc.Service); err != nil || !mine {
			return err
		}
	}
	if _, err := b.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(svcID)}); err != nil {
		var inUse *types.ResourceInUse
		if errors.As(err, &inUse) {
			return nil // someone registered meanwhile: the service is theirs to keep
		}
		if !isNotFound(err) {
			return err
		}
	}
	b.forget(key)
	return b.deleteNamespace(ctx, key, aws.ToString(svc.Service.NamespaceId))
}

// listRecords tells whether a service holds records of this cluster's
// and of others. Asked of the control plane (ListInstances), as
// InstanceCount is: a data-plane read lags, and may not show yet a record
// whose registration finished a moment ago while its deregistration still
// runs (a withdrawal right after an export left its service behind so).
// Across accounts, a record another account wrote under this cluster's
// name counts as another's.
func (b *Backend) listRecords(ctx context.Context, svcID string) (ours, others bool, err error) {
	err = b.eachInstance(ctx, svcID, func(in types.InstanceSummary) bool {
		ours = in.Attributes[recordfmt.AttrClusterID] == b.o.Cluster && in.Attributes[recordfmt.AttrClusterSetID] == b.o.ClusterSet &&
			(!b.tenancy.bindsWriters() || b.o.Account == "" || aws.ToString(in.CreatedByAccount) == b.o.Account)
		others = others || !ours
		return !ours
	})
	return ours, others, err
}

// deleteNamespace deletes a namespace clustermap created once it holds no
// service. The deletion is asynchronous and can fail after Cloud Map
// accepted it: the withdrawal is pending until the namespace is gone, or
// found kept (a service, not ours).
func (b *Backend) deleteNamespace(ctx context.Context, key registry.Key, nsID string) error {
	if !b.owner.deletesNamespaces() {
		return nil
	}
	b.mu.Lock()
	b.emptied[key.Namespace] = nsID
	b.mu.Unlock()
	done := func() error {
		b.mu.Lock()
		delete(b.emptied, key.Namespace)
		b.mu.Unlock()
		return nil
	}
	ns, err := b.c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(nsID)})
	switch {
	case isNotFound(err):
		return done()
	case err != nil:
		return err
	case aws.ToInt32(ns.Namespace.ServiceCount) > 0:
		return done()
	}
	if mine, err := b.owner.createdNamespace(ctx, ns.Namespace.Arn); err != nil || !mine {
		if err != nil {
			return err
		}
		return done()
	}
	b.mu.Lock()
	delete(b.namespaces, key.Namespace)
	b.mu.Unlock()
	_, err = b.c.DeleteNamespace(ctx, &sd.DeleteNamespaceInput{Id: aws.String(nsID)})
	var inUse *types.ResourceInUse
	var busy *types.DuplicateRequest
	switch {
	case errors.As(err, &inUse), isNotFound(err):
		return done() // someone created a service meanwhile: theirs to keep
	case err == nil, errors.As(err, &busy):
		return ErrPending // asked again until the namespace is gone
	}
	return err
}

// ownInstances lists this cluster's records of a service.
func (b *Backend) ownInstances(ctx context.Context, key registry.Key) (map[string]recordfmt.Attrs, error) {
	out, err := b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(key.Namespace), ServiceName: aws.String(key.Name), HealthStatus: types.HealthStatusFilterAll,
		QueryParameters: map[string]string{recordfmt.AttrClusterID: b.o.Cluster, recordfmt.AttrClusterSetID: b.o.ClusterSet}, MaxResults: aws.Int32(recordfmt.MaxInstances),
		OwnerAccount: b.tenancy.ownerAccount(),
	})
	if isNotFound(err) {
		return map[string]recordfmt.Attrs{}, nil
	}
	if err != nil {
		return nil, err
	}
	cur := make(map[string]recordfmt.Attrs, len(out.Instances))
	for _, in := range out.Instances {
		cur[aws.ToString(in.InstanceId)] = in.Attributes
	}
	return b.withRecent(key, cur), nil
}

// recentWrite is one of this cluster's writes of a record: what it
// registered (nil: deregistered), its operation, when it was written and,
// once the change feed saw its operation finish, when that was.
type recentWrite struct {
	attrs    recordfmt.Attrs
	op       string
	at, done time.Time
}

// sent notes a write of this cluster's record of key that Cloud Map took,
// by operation op (empty: none, the record was gone already): the
// operation is this cluster's own, and laid over reads until it ends.
func (b *Backend) sent(key registry.Key, w cloudmapclient.Write, op string) {
	if op != "" {
		b.ownOp(&op, key)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.recent[key] == nil {
		b.recent[key] = map[string]recentWrite{}
	}
	r := recentWrite{attrs: w.Attributes, op: op, at: time.Now()}
	if op == "" {
		r.done = r.at
	}
	b.recent[key][w.ID] = r
}

// writeDone notes that the operation of a recent write of key finished.
func (b *Backend) writeDone(key registry.Key, op string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, w := range b.recent[key] {
		if w.op == op {
			w.done = at
			b.recent[key][id] = w
		}
	}
}

// withRecent is this cluster's records of key as read, with its recent
// writes over them: Cloud Map's reads may not show a write until its
// operation finished and the read lag passed, and a publish that diffed
// against such a read would leave behind a record it replaced. A write is
// laid over reads until ReadLag after its operation finished (as the
// change feed saw it), or registrationTimeout after it was made where the
// finish is not seen (a member account lists no operations); past that,
// the read is the truth (someone else may have removed a record).
func (b *Backend) withRecent(key registry.Key, cur map[string]recordfmt.Attrs) map[string]recordfmt.Attrs {
	lag := b.o.Watch.ReadLag
	if lag <= 0 {
		lag = DefaultReadLag
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, w := range b.recent[key] {
		expired := time.Since(w.at) > registrationTimeout
		if !w.done.IsZero() {
			expired = time.Since(w.done) > lag
		}
		switch {
		case expired:
			delete(b.recent[key], id)
		case w.attrs == nil:
			delete(cur, id)
		default:
			cur[id] = w.attrs
		}
	}
	if len(b.recent[key]) == 0 {
		delete(b.recent, key)
	}
	return cur
}

func (b *Backend) ensureNamespace(ctx context.Context, name string) (string, error) {
	b.mu.Lock()
	id, ok := b.namespaces[name]
	b.mu.Unlock()
	if ok {
		return id, nil
	}
	// Exports of one new namespace published at once look it up (and
	// create it) once.
	ref, err, _ := b.nsLookups.Do(name, func() (any, error) { return b.lookUpNamespace(ctx, name) })
	return ref.(string), err
}

func (b *Backend) lookUpNamespace(ctx context.Context, name string) (string, error) {
	member := b.tenancy.member()
	notShared := &registry.NotSharedError{Namespace: name, Owner: b.o.Owner, Account: b.o.Account}
	b.mu.Lock()
	missing := time.Since(b.unshared[name]) < unsharedMemory
	b.mu.Unlock()
	if member && missing {
		return "", notShared // every export waiting for the share costs one listing
	}
	id, err := b.findNamespace(ctx, name)
	if err != nil {
		return "", err
	}
	if id == "" && member {
		// Only the owner account creates the clusterset's namespaces.
		b.mu.Lock()
		b.unshared[name] = time.Now()
		b.mu.Unlock()
		return "", notShared
	}
	if id == "" {
		out, err := b.c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{
			Name: aws.String(name), Tags: tagged{clusterSet: b.o.ClusterSet}.tags(),
			Description: aws.String("Kubernetes namespace " + name + ", created by clustermap"),
		})
		var exists *types.NamespaceAlreadyExists
		var busy *types.DuplicateRequest
		var opID *string
		if out != nil {
			opID = out.OperationId
		}
		switch {
		case errors.As(err, &exists):
			id = aws.ToString(exists.NamespaceId)
		case errors.As(err, &busy):
			// Another cluster of the account is creating it: its
			// operation says when, and what.
			opID = busy.DuplicateOperationId
			fallthrough
		case err == nil:
			op, err := cloudmapclient.WaitOperation(ctx, b.c, opID)
			if err != nil {
				return "", fmt.Errorf("creating Cloud Map namespace %s: %w", name, err)
			}
			id = op.Targets[string(types.OperationTargetTypeNamespace)]
		default:
			return "", fmt.Errorf("creating Cloud Map namespace %s: %w", name, err)
		}
	}
	b.mu.Lock()
	b.namespaces[name] = id
	b.mu.Unlock()
	return id, nil
}

// findNamespace finds a namespace's ref: its id, or in a shared namespace
// its ARN; "" when there is none.
func (b *Backend) findNamespace(ctx context.Context, name string) (string, error) {
	ns, err := cloudmapclient.FindOwnedNamespace(ctx, b.c, name, types.NamespaceTypeHttp, b.o.Owner)
	if err != nil {
		return "", fmt.Errorf("looking up Cloud Map namespace %s: %w", name, err)
	}
	if ns == nil {
		return "", nil
	}
	return b.tenancy.ref(ns.Id, ns.Arn), nil
}

// ensureService finds or creates a service. A service not in the cache is
// created outright: when it exists, the error names it, which costs one
// call where listing the namespace's services would cost a page per 100.
func (b *Backend) ensureService(ctx context.Context, nsID string, key registry.Key) (string, error) {
	b.mu.Lock()
	id, ok := b.services[key]
	b.mu.Unlock()
	if ok {
		return id, nil
	}
	in := &sd.CreateServiceInput{
		Name: aws.String(key.Name), NamespaceId: aws.String(nsID),
		Description: aws.String("Kubernetes Service " + key.String() + ", exported by clustermap"),
	}
	b.owner.mark(in)
	out, err := b.c.CreateService(ctx, in)
	var exists *types.ServiceAlreadyExists
	switch {
	case errors.As(err, &exists):
		id = b.tenancy.ref(exists.ServiceId, exists.ServiceArn)
	case err != nil:
		var gone *types.NamespaceNotFound
		if errors.As(err, &gone) {
			b.mu.Lock()
			delete(b.namespaces, key.Namespace)
			b.mu.Unlock()
			if b.tenancy.member() {
				return "", &registry.NotSharedError{Namespace: key.Namespace, Owner: b.o.Owner, Account: b.o.Account}
			}
		}
		return "", fmt.Errorf("creating Cloud Map service %s: %w", key, err)
	default:
		id = b.tenancy.ref(out.Service.Id, out.Service.Arn)
		b.mu.Lock()
		b.created[id] = true
		b.mu.Unlock()
	}
	b.remember(key, id)
	return id, nil
}

// serviceID finds a service's id, "" when Cloud Map has none.
func (b *Backend) serviceID(ctx context.Context, key registry.Key) (string, error) {
	b.mu.Lock()
	id, ok := b.services[key]
	nsID, nsKnown := b.namespaces[key.Namespace]
	b.mu.Unlock()
	if ok {
		return id, nil
	}
	if !nsKnown {
		var err error
		if nsID, err = b.findNamespace(ctx, key.Namespace); err != nil || nsID == "" {
			return "", err
		}
	}
	p := sd.NewListServicesPaginator(b.c, &sd.ListServicesInput{Filters: []types.ServiceFilter{
		{Name: types.ServiceFilterNameNamespaceId, Values: []string{nsID}},
	}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return "", err
		}
		for _, s := range page.Services {
			if aws.ToString(s.Name) == key.Name {
				ref := b.tenancy.ref(s.Id, s.Arn)
				b.remember(key, ref)
				return ref, nil
			}
		}
	}
	return "", nil
}

func (b *Backend) remember(key registry.Key, ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.services[key] = ref
	b.keys[idOf(ref)] = key
}

// keyOf is the service a Cloud Map service id was remembered as.
func (b *Backend) keyOf(id string) (registry.Key, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key, ok := b.keys[id]
	return key, ok
}

// rememberNamespace keeps a namespace's id, as the watcher's listing found it.
func (b *Backend) rememberNamespace(name, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.namespaces[name] = id
}

func (b *Backend) forget(key registry.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.created, b.services[key])
	delete(b.keys, idOf(b.services[key]))
	delete(b.services, key)
}

func (b *Backend) ownOp(id *string, key registry.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ownOps[aws.ToString(id)] = ownOp{key: key, started: time.Now()}
}

// takeOwnOp tells whether this cluster started an operation, on which
// service and when; it is forgotten then.
func (b *Backend) takeOwnOp(id string) (ownOp, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	op, ok := b.ownOps[id]
	delete(b.ownOps, id)
	return op, ok
}

// opFinished hears how an operation of this cluster's on key ended: a
// failure is held against the service until an operation started after it
// succeeds, and the exporter is told of both. op is the ended operation
// when the caller read it (nil: a failure's error is read here).
func (b *Backend) opFinished(ctx context.Context, id string, key registry.Key, started time.Time, failed bool, op *types.Operation) {
	if !failed {
		b.writeDone(key, id, time.Now())
	}
	if key.Namespace == ChangesNamespace(b.o.ClusterSet) {
		if failed {
			// Unwritten, the record tells no other account of this
			// cluster's changes (nor proves it alive): it goes again.
			b.mu.Lock()
			delete(b.recent, key) // not there: a withdrawal reads the truth
			b.mu.Unlock()
			b.record.failed()
			b.o.Log.Error(nil, "Cloud Map accepted a write of this cluster's change record, then failed it; it is written again", "operation", id)
		}
		return
	}
	b.mu.Lock()
	prev, had := b.failed[key]
	b.mu.Unlock()
	if !failed {
		if had && started.After(prev.at) {
			b.mu.Lock()
			delete(b.failed, key)
			b.mu.Unlock()
			b.o.Log.Info("a write that failed in Cloud Map was made good", "service", key.String())
			b.o.Observer.WriteFailed(key)
		}
		return
	}
	if had && prev.op == id {
		return // told already (the change feed and the publish both see it)
	}
	reason := "Cloud Map accepted a write of this export's records, then failed it (operation " + id + ")"
	if op == nil {
		if out, err := b.c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(id), OwnerAccount: b.tenancy.ownerAccount()}); err == nil {
			op = out.Operation
		}
	}
	if op != nil {
		reason += ": " + string(op.Type) + " " + aws.ToString(op.ErrorCode) + " " + aws.ToString(op.ErrorMessage)
	}
	b.mu.Lock()
	b.failed[key] = lateFailure{at: time.Now(), op: id, reason: reason}
	delete(b.recent, key) // what failed is not there: the next publish reads
	delete(b.registering, key)
	b.mu.Unlock()
	b.o.Log.Error(nil, "a Cloud Map operation failed after it was accepted; the export is written again", "service", key.String(), "operation", id, "reason", reason)
	b.o.Observer.WriteFailed(key)
}

// WriteFailure says why this cluster's export of key is not all in Cloud
// Map although every call was accepted: a write failed later, and none
// since made it good. Nil when there is no such failure.
func (b *Backend) WriteFailure(key registry.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.failed[key]; ok {
		return &registry.LateFailureError{Reason: f.reason}
	}
	return nil
}

// expireOwnOps forgets operations started before cutoff that no one saw
// end, and has what they wrote written again: one may have failed after
// Cloud Map accepted it (a change feed that fell behind, a catch-up that
// read past it, questions refused), and a publish or withdrawal that
// finds its records as they should be writes nothing. Without it, such a
// failure would wait for the next change or the 10-minute republish.
func (b *Backend) expireOwnOps(cutoff time.Time) {
	b.mu.Lock()
	expired := map[registry.Key]bool{}
	for id, op := range b.ownOps {
		if op.started.Before(cutoff) {
			delete(b.ownOps, id)
			expired[op.key] = true
		}
	}
	b.mu.Unlock()
	if len(expired) > 0 && b.due("own operations unseen") {
		b.o.Log.Info("some of this cluster's Cloud Map writes were not seen to end; their services are written again, in case one failed after it was accepted", "services", len(expired))
	}
	for key := range expired {
		if key.Namespace == ChangesNamespace(b.o.ClusterSet) {
			b.record.failed()
			continue
		}
		b.o.Observer.WriteFailed(key)
	}
}

func isNotFound(err error) bool { return cloudmapclient.IsNotFound(err) }

func (b *Backend) maxImportEndpoints() int {
	if b.o.MaxImportEndpoints > 0 {
		return b.o.MaxImportEndpoints
	}
	return registry.DefaultMaxImportEndpoints
}
