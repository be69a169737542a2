package imports

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/conditions"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

// View is what this cluster knows of the clusterset's exports, changed
// only on positive knowledge from the registry. Each change queues the
// service's import.
type View struct {
	mu      sync.RWMutex
	exports map[registry.Key][]registry.Export
	// unreadable are services whose last read failed: their imports stay
	// as they are.
	unreadable map[registry.Key]bool
	// heard are the services the registry told of since the view was
	// made; witnessed those it told exports of. A service imported here
	// that the registry says is exported nowhere, never witnessed exported
	// since a restart, is gone only by the registry's word at start: a
	// wrong Region or account says so of everything.
	heard, witnessed map[registry.Key]bool
	events           chan event.GenericEvent
	// synced is set once the whole registry was read: before that an
	// empty view means "not read yet", not "exported nowhere".
	synced atomic.Bool
}

var _ registry.Sink = (*View)(nil)

// Synced says the view now holds every service of the registry.
func (v *View) Synced() { v.synced.Store(true) }

// NewView makes an empty view.
func NewView() *View {
	return &View{exports: map[registry.Key][]registry.Export{}, unreadable: map[registry.Key]bool{},
		heard: map[registry.Key]bool{}, witnessed: map[registry.Key]bool{}, events: make(chan event.GenericEvent, 4096)}
}

// Unreadable says a service could not be read: nothing of its import is
// changed or removed until Set says what it is.
func (v *View) Unreadable(key registry.Key) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.unreadable[key] = true
}

func (v *View) isUnreadable(key registry.Key) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.unreadable[key]
}

// Set records a service's exports (none: not exported anywhere).
func (v *View) Set(key registry.Key, exports []registry.Export) {
	v.mu.Lock()
	delete(v.unreadable, key)
	v.heard[key] = true
	if len(exports) == 0 {
		delete(v.exports, key)
	} else {
		v.exports[key] = exports
		v.witnessed[key] = true
	}
	v.mu.Unlock()
	v.events <- event.GenericEvent{Object: &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
}

// Heard says whether the registry told of a service since the view was
// made, and whether it told exports of it.
func (v *View) Heard(key registry.Key) (heard, witnessed bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.heard[key], v.witnessed[key]
}

// Get returns a service's exports.
func (v *View) Get(key registry.Key) []registry.Export {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.exports[key]
}

// InNamespace lists the exported services of a namespace.
func (v *View) InNamespace(ns string) []registry.Key {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var keys []registry.Key
	for k := range v.exports {
		if k.Namespace == ns {
			keys = append(keys, k)
		}
	}
	return keys
}

// LocalFirst lists the services some export of which asks for local-first
// routing: their imports depend on where this cluster's nodes are.
func (v *View) LocalFirst() []registry.Key {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var keys []registry.Key
	for k, exports := range v.exports {
		if slices.ContainsFunc(exports, func(e registry.Export) bool { return locality.Asks(e.TrafficDistribution) }) {
			keys = append(keys, k)
		}
	}
	return keys
}

// Reconciler keeps one cluster's imports equal to the view.
type Reconciler struct {
	Client     client.Client
	Gate       *clusterid.Gate
	View       *View
	Recorder   record.EventRecorder
	Namespaces func(string) bool
	// Region is this cluster's Region (its registry's), for local-first
	// routing's Region tier.
	Region string
	// MaxEndpoints caps the endpoint records imported of each cluster's
	// export (0: registry.DefaultMaxImportEndpoints). A registry that
	// decodes records caps them as it does (so that a hostile record
	// costs no memory); this holds the cap over any registry.
	MaxEndpoints int

	// invalidSaid remembers, per import, the skipped records last reported,
	// so that each is said once, not at every reconcile.
	invalidSaid sync.Map
	// heldSaid remembers the imports whose held removal was reported;
	// drainedSaid the drained clusters last reported per import.
	heldSaid, drainedSaid sync.Map
}

// SetupWithManager reconciles on view changes, on changes to what we
// created, and when a namespace appears.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byServiceName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[mcsv1beta1.LabelServiceName]
		if name == "" || o.GetLabels()[LabelManagedBy] != managedByValue {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
	})
	sameName := kube.EnqueueSameName
	namespaceImports := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		for _, k := range r.View.InNamespace(o.GetName()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: k.Namespace, Name: k.Name}})
		}
		return reqs
	})
	localFirst := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		for _, k := range r.View.LocalFirst() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: k.Namespace, Name: k.Name}})
		}
		return reqs
	})
	// Only a node's zone matters here, and only for local-first imports.
	zoneChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()
			return o[locality.LabelZone] != n[locality.LabelZone] || o[locality.LabelZoneID] != n[locality.LabelZoneID]
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	inScope := kube.InScope(r.Namespaces)
	return ctrl.NewControllerManagedBy(mgr).
		Named("serviceimport").
		// Our own status writes need no new reconcile.
		For(&mcsv1beta1.ServiceImport{}, builder.WithPredicates(inScope, predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Service{}, byServiceName, builder.WithPredicates(inScope)).
		Watches(&discoveryv1.EndpointSlice{}, byServiceName, builder.WithPredicates(inScope)).
		// A local export's conditions carry the import's conflicts.
		Watches(&mcsv1beta1.ServiceExport{}, sameName, builder.WithPredicates(inScope, predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, namespaceImports, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return true },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		Watches(nodeMetadata(), localFirst, builder.OnlyMetadata, builder.WithPredicates(zoneChanged)).
		WatchesRawSource(source.Channel(r.View.events, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := r.reconcile(ctx, req)
	if errorsIsConflict(err) {
		// A write raced another: the cache had not seen a write yet (ours
		// of an earlier pass, as in a bulk import, or someone else's). A
		// pass writes each object once, from what it read, so one pass
		// never conflicts with itself: read again soon.
		log.FromContext(ctx).V(1).Info("import write conflicted; reading again", "import", req.String(), "error", err.Error())
		return reconcile.Result{RequeueAfter: conflictRetry}, nil
	}
	return res, err
}

// conflictRetry is how soon an import whose write conflicted is read
// again: the cache has the newer object by then.
const conflictRetry = 100 * time.Millisecond

// errorsIsConflict says every error joined in err is an optimistic
// concurrency conflict (one other error makes it a real failure).
func errorsIsConflict(err error) bool {
	if err == nil {
		return false
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if e != nil && !errorsIsConflict(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err)
}

func (r *Reconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !r.Namespaces(req.Namespace) {
		return reconcile.Result{}, nil
	}
	if _, _, open := r.Gate.Get(); !open {
		// Come back once the identity is known: a stale import must still
		// be found and removed then.
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	key := registry.Key{Namespace: req.Namespace, Name: req.Name}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: req.Namespace}, ns); apierrors.IsNotFound(err) || (err == nil && !ns.DeletionTimestamp.IsZero()) {
		return reconcile.Result{}, nil // imported when the namespace is created
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if r.View.isUnreadable(key) {
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	exports := r.View.Get(key)
	if !r.View.synced.Load() {
		// Until the registry was read once (every Region of it), what it
		// said so far creates and updates imports, and removes nothing: a
		// Region down at a restart holds up no other Region's changes.
		if hold, err := r.beforeSync(ctx, key, exports); hold || err != nil {
			return reconcile.Result{RequeueAfter: time.Second}, err
		}
	}
	if len(exports) == 0 {
		r.invalidSaid.Delete(key)
		r.drainedSaid.Delete(key)
		return r.removeChecked(ctx, key)
	}
	r.heldSaid.Delete(key)
	// Read once: the creation times it clamps, then the object written.
	have := &mcsv1beta1.ServiceImport{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, have); apierrors.IsNotFound(err) {
		have = nil
	} else if err != nil {
		return reconcile.Result{}, err
	}
	exports, joined := joinedExporters(have, exports, r.View.synced.Load(), time.Now())
	exports = capEndpoints(exports, cmp.Or(r.MaxEndpoints, registry.DefaultMaxImportEndpoints))
	exports, floored := drainFloor(exports)
	m := merge.Merge(exports)
	var hints map[locality.Endpoint][]string
	if locality.Asks(m.Spec.TrafficDistribution) {
		here, err := r.here(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		hints = locality.Plan(here, m.Exports)
	}
	d := Plan(key, m, hints)

	// Each object is written at most once a pass: the ServiceImport is
	// created (or read) first, as the owner of the rest, and its spec,
	// metadata and status are written last, once what they depend on (the
	// derived Service's IPs, the AWS controller's leftovers gone) is known.
	si, err := r.importFor(ctx, have, d.Import)
	if err != nil {
		return reconcile.Result{}, err // nothing else can be owned without it
	}
	r.reportInvalid(si, key, m.Exports)
	// One object the API server refuses does not keep the others (the
	// slices, the VIP, the status) from being written: each failure is
	// reported and retried, the rest goes on.
	var errs []error
	failed := func(what string, err error) {
		if err == nil {
			return
		}
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
		if !apierrors.IsConflict(err) {
			r.Recorder.Event(si, corev1.EventTypeWarning, "ImportWriteFailed", fmt.Sprintf("writing the %s of this import failed: %v", what, err))
		}
	}
	ips := si.Spec.IPs
	localDropped := false
	if err := checkPorts(d.Service); err != nil {
		// Merged from several clusters' exports: what the API server
		// would refuse is said, not sent.
		failed("derived Service", err)
	} else if d.Service != nil {
		svc, err := r.applyService(ctx, si, d.Service)
		failed("derived Service", err)
		if err == nil {
			ips = svc.Spec.ClusterIPs
			localDropped = d.Service.Spec.TrafficDistribution != nil && svc.Spec.TrafficDistribution == nil
		}
	} else {
		failed("derived Service", r.deleteDerived(ctx, key))
		ips = nil
	}
	failed("EndpointSlices", r.applySlices(ctx, si, key, d.Slices))
	awsDerived, fromAWS := si.Annotations[AWSDerivedServiceAnnotation]
	if fromAWS && len(errs) == 0 {
		// The AWS controller's objects go only once all of ours are in
		// place; its annotation goes with them, in the update below.
		if err := r.dropAWSLeftovers(ctx, si, awsDerived); err != nil {
			return reconcile.Result{}, err
		}
		fromAWS = false
	}
	spec := d.Import.Spec
	spec.IPs = ips
	annotations := d.Import.Annotations
	if fromAWS {
		annotations = withAWSMark(si, annotations)
	}
	annotations = maps.Clone(annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[JoinedAnnotation] = joined
	if !reflect.DeepEqual(si.Spec, spec) || !reflect.DeepEqual(si.Labels, d.Import.Labels) || !reflect.DeepEqual(si.Annotations, annotations) {
		si.Spec, si.Labels, si.Annotations = spec, d.Import.Labels, annotations
		err := r.Client.Update(ctx, si)
		failed("ServiceImport", err)
		if err == nil && awsDerived != "" && !fromAWS {
			r.Recorder.Event(si, corev1.EventTypeNormal, "AdoptedFromAWSController",
				fmt.Sprintf("clustermap took this ServiceImport over from the AWS Cloud Map MCS controller and removed its derived Service %s and EndpointSlices", awsDerived))
		}
	}
	status := si.Status.DeepCopy()
	status.Clusters = d.Import.Status.Clusters
	status.EndpointSliceObjects = d.Import.Status.EndpointSliceObjects
	meta.RemoveStatusCondition(&status.Conditions, ConditionRemovalHeld)
	r.reportDrained(si, key, m.Exports, floored, status)
	setCapped(si, m.Exports, status)
	r.reportLocalityDropped(si, localDropped, status)
	if err := errors.Join(errs...); !errorsIsConflict(err) {
		// A conflict is retried at once: no flip of Ready for it.
		meta.SetStatusCondition(&status.Conditions, readyCondition(si.Generation, err))
	}
	if !equality.Semantic.DeepEqual(&si.Status, status) {
		si.Status = *status
		failed("ServiceImport status", r.Client.Status().Update(ctx, si))
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, errors.Join(err, r.reportConflicts(ctx, key, m))
	}
	return reconcile.Result{}, r.reportConflicts(ctx, key, m)
}

func nodeMetadata() *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}}
}

// here says where this cluster is: its id, Region (the registry's word
// where it has one: a hub's admin names each member's), and its nodes'
// zones (read as metadata from the cache).
func (r *Reconciler) here(ctx context.Context) (locality.Here, error) {
	id, reg, _ := r.Gate.Get()
	region := r.Region
	if l, ok := reg.(registry.Located); ok && l.Region() != "" {
		region = l.Region()
	}
	nodes := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}}
	if err := r.Client.List(ctx, nodes); err != nil {
		return locality.Here{}, fmt.Errorf("listing nodes for their zones: %w", err)
	}
	labels := make([]map[string]string, len(nodes.Items))
	for i, n := range nodes.Items {
		labels[i] = n.Labels
	}
	return locality.Here{Cluster: id.ClusterID, Region: region, Zones: locality.ZonesOf(labels)}, nil
}

// importFor is the ServiceImport as read (have), or creates it as planned
// when there is none (without IPs or status: those come once its derived
// Service exists); one that clustermap did not create, nor can take over,
// is an error.
func (r *Reconciler) importFor(ctx context.Context, have, want *mcsv1beta1.ServiceImport) (*mcsv1beta1.ServiceImport, error) {
	if have == nil {
		si := want.DeepCopy()
		si.Status = mcsv1beta1.ServiceImportStatus{}
		return si, r.Client.Create(ctx, si)
	}
	if have.Labels[LabelManagedBy] != managedByValue && !adoptable(have) {
		return nil, fmt.Errorf("ServiceImport %s exists and was not created by clustermap: delete it to let clustermap import the service", client.ObjectKeyFromObject(have))
	}
	return have, nil
}

func (r *Reconciler) applyService(ctx context.Context, owner *mcsv1beta1.ServiceImport, want *corev1.Service) (*corev1.Service, error) {
	if err := controllerutil.SetControllerReference(owner, want, r.Client.Scheme()); err != nil {
		return nil, err
	}
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), svc)
	if apierrors.IsNotFound(err) {
		return r.createService(ctx, want)
	}
	if err != nil {
		return nil, err
	}
	if svc.Labels[LabelDerivedFor] != owner.Name {
		return nil, fmt.Errorf("Service %s exists and is not clustermap's derived Service for %s", client.ObjectKeyFromObject(svc), owner.Name)
	}
	families := want.Spec.IPFamilies
	if len(families) > 0 && (len(svc.Spec.IPFamilies) == 0 || !slices.Contains(families, svc.Spec.IPFamilies[0])) {
		// The primary family cannot change in place: recreate (a new VIP).
		if err := r.Client.Delete(ctx, svc); err != nil {
			return nil, err
		}
		return r.createService(ctx, want)
	}
	changed := !reflect.DeepEqual(svc.Spec.Ports, want.Spec.Ports) || svc.Spec.SessionAffinity != want.Spec.SessionAffinity ||
		!reflect.DeepEqual(svc.Spec.SessionAffinityConfig, want.Spec.SessionAffinityConfig) ||
		!reflect.DeepEqual(svc.Spec.InternalTrafficPolicy, want.Spec.InternalTrafficPolicy) && want.Spec.InternalTrafficPolicy != nil ||
		!reflect.DeepEqual(svc.Spec.TrafficDistribution, want.Spec.TrafficDistribution) ||
		len(families) > 0 && !reflect.DeepEqual(svc.Spec.IPFamilyPolicy, want.Spec.IPFamilyPolicy)
	if !changed {
		return svc, nil
	}
	svc.Spec.Ports, svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = want.Spec.Ports, want.Spec.SessionAffinity, want.Spec.SessionAffinityConfig
	if want.Spec.InternalTrafficPolicy != nil {
		svc.Spec.InternalTrafficPolicy = want.Spec.InternalTrafficPolicy
	}
	svc.Spec.TrafficDistribution = want.Spec.TrafficDistribution
	if len(families) > 0 && !reflect.DeepEqual(svc.Spec.IPFamilyPolicy, want.Spec.IPFamilyPolicy) {
		// The secondary family changes in place, the primary VIP kept: to
		// PreferDualStack the API server adds it where the cluster has it;
		// to SingleStack it goes.
		svc.Spec.IPFamilyPolicy = want.Spec.IPFamilyPolicy
		if *want.Spec.IPFamilyPolicy == corev1.IPFamilyPolicySingleStack {
			svc.Spec.IPFamilies = svc.Spec.IPFamilies[:1]
			if len(svc.Spec.ClusterIPs) > 1 {
				svc.Spec.ClusterIPs = svc.Spec.ClusterIPs[:1]
			}
		}
	}
	return svc, r.Client.Update(ctx, svc)
}

// errFamilyNotSupported says no family of an import is one the cluster's
// Services can have.
var errFamilyNotSupported = errors.New("this cluster's Services can have none of the import's IP families")

// createService creates the derived Service; when the API server refuses
// its families (a single-stack cluster), it tries each family alone, then
// says none fits.
func (r *Reconciler) createService(ctx context.Context, want *corev1.Service) (*corev1.Service, error) {
	err := r.Client.Create(ctx, want)
	if !apierrors.IsInvalid(err) || len(want.Spec.IPFamilies) == 0 {
		return want, err
	}
	if len(want.Spec.IPFamilies) == 2 {
		// The API server takes no family it lacks, even a preferred
		// second one: each alone, the policy kept, which a dual-stack
		// cluster would have filled in.
		for _, f := range want.Spec.IPFamilies {
			one := want.DeepCopy()
			one.Spec.IPFamilies = []corev1.IPFamily{f}
			if err2 := r.Client.Create(ctx, one); !apierrors.IsInvalid(err2) {
				return one, err2
			}
		}
	}
	return nil, fmt.Errorf("%w (%v): %v", errFamilyNotSupported, want.Spec.IPFamilies, err)
}

// readyCondition is the import's Ready condition after its writes.
func readyCondition(generation int64, err error) metav1.Condition {
	c := metav1.Condition{Type: string(mcsv1beta1.ServiceImportConditionReady), Status: metav1.ConditionTrue,
		Reason: string(mcsv1beta1.ServiceImportReasonReady), Message: "the import's derived Service and EndpointSlices are written", ObservedGeneration: generation}
	switch {
	case errors.Is(err, errFamilyNotSupported):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonIPFamilyNotSupported), err.Error()
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonPending), err.Error()+" (retried)"
	}
	return c
}

// applySlices makes our EndpointSlices of the import exactly the desired ones.
// Writes that take traffic from an endpoint go before the others: between
// two writes kube-proxy then routes to fewer endpoints, never to dying ones
// beside their replacements (on failover, cluster A's slice turns unready
// before cluster B's is hinted for the zone).
func (r *Reconciler) applySlices(ctx context.Context, owner *mcsv1beta1.ServiceImport, key registry.Key, want []*discoveryv1.EndpointSlice) error {
	have := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, have, client.InNamespace(key.Namespace),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: key.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	existing := map[string]*discoveryv1.EndpointSlice{}
	for i := range have.Items {
		existing[have.Items[i].Name] = &have.Items[i]
	}
	var narrowing, rest []func() error
	var wanted []discoveryv1.Endpoint
	for _, s := range want {
		if err := controllerutil.SetControllerReference(owner, s, r.Client.Scheme()); err != nil {
			return err
		}
		wanted = append(wanted, s.Endpoints...)
		cur, ok := existing[s.Name]
		delete(existing, s.Name)
		switch {
		case !ok:
			rest = append(rest, func() error { return r.Client.Create(ctx, s) })
		case !reflect.DeepEqual(cur.Endpoints, s.Endpoints) || !reflect.DeepEqual(cur.Ports, s.Ports) || !reflect.DeepEqual(cur.Labels, s.Labels):
			write := func() error {
				cur.Endpoints, cur.Ports, cur.Labels = s.Endpoints, s.Ports, s.Labels
				return r.Client.Update(ctx, cur)
			}
			if narrows(cur.Endpoints, s.Endpoints) {
				narrowing = append(narrowing, write)
			} else {
				rest = append(rest, write)
			}
		}
	}
	for _, s := range existing {
		// A slice renamed (its ports changed) goes after its replacement.
		write := func() error { return client.IgnoreNotFound(r.Client.Delete(ctx, s)) }
		if narrows(s.Endpoints, wanted) {
			narrowing = append(narrowing, write)
		} else {
			rest = append(rest, write)
		}
	}
	var errs []error
	for _, write := range append(narrowing, rest...) {
		errs = append(errs, write())
	}
	return errors.Join(errs...)
}

// narrows reports whether endpoints to take traffic from some endpoint of
// from: its address gone, no longer one kube-proxy routes to, or hinted for
// fewer zones (no hints is every zone).
func narrows(from, to []discoveryv1.Endpoint) bool {
	const anyZone = ""
	routes := func(eps []discoveryv1.Endpoint) map[[2]string]bool {
		out := map[[2]string]bool{}
		for _, ep := range eps {
			c := ep.Conditions
			// kube-proxy's choice: ready ones, else serving terminating ones.
			if !ptr.Deref(c.Ready, true) && !(ptr.Deref(c.Serving, false) && ptr.Deref(c.Terminating, false)) {
				continue
			}
			for _, a := range ep.Addresses {
				if ep.Hints == nil {
					out[[2]string{a, anyZone}] = true
					continue
				}
				for _, z := range ep.Hints.ForZones {
					if z.Name != locality.Nowhere { // a zone no node is in
						out[[2]string{a, z.Name}] = true
					}
				}
			}
		}
		return out
	}
	now := routes(to)
	for r := range routes(from) {
		if !now[r] && !now[[2]string{r[0], anyZone}] {
			return true
		}
	}
	return false
}

// remove deletes the import and what it owns: the service is exported
// nowhere any more.
func (r *Reconciler) remove(ctx context.Context, key registry.Key) error {
	si := &mcsv1beta1.ServiceImport{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, si)
	if err == nil && si.Labels[LabelManagedBy] == managedByValue {
		if err := client.IgnoreNotFound(r.Client.Delete(ctx, si)); err != nil {
			return err
		}
	} else if client.IgnoreNotFound(err) != nil {
		return err
	}
	// Owned objects would go with the import; deleting them now makes the
	// removal immediate rather than wait for garbage collection.
	if err := r.Client.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(key.Namespace),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: key.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	return r.deleteDerived(ctx, key)
}

func (r *Reconciler) deleteDerived(ctx context.Context, key registry.Key) error {
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: DerivedName(key.Name)}, svc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Labels[LabelDerivedFor] != key.Name {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, svc))
}

// reportInvalid says, with a Warning Event on the import, which registry
// records were skipped (the valid endpoints import without them), and which
// clusters write a record format newer than this release's.
func (r *Reconciler) reportInvalid(si *mcsv1beta1.ServiceImport, key registry.Key, exports []registry.Export) {
	type said struct{ reason, msg string }
	var msgs []said
	for _, e := range exports {
		for _, inv := range e.Invalid {
			cluster, exportsNothing := e.Cluster, ""
			if inv.Cluster != "" {
				cluster, exportsNothing = inv.Cluster, " (the cluster exports nothing else here, so it is not among the exporters)"
			}
			if inv.ID == "" { // registry.CapInvalid's count of the rest
				msgs = append(msgs, said{"InvalidRecord", fmt.Sprintf("cluster %s: %s", cluster, inv.Reason)})
				continue
			}
			msgs = append(msgs, said{"InvalidRecord", fmt.Sprintf("cluster %s exports a record that was skipped: instance %s: %s (fix or deregister that instance)%s", cluster, inv.ID, inv.Reason, exportsNothing)})
		}
		if e.Capped > 0 {
			msgs = append(msgs, said{ConditionEndpointsCapped, cappedMessage(e)})
		}
		if e.Newer != "" {
			msgs = append(msgs, said{"NewerRecordFormat", fmt.Sprintf("cluster %s writes %s: imported as far as this release can read it; upgrade clustermap in this cluster", e.Cluster, e.Newer)})
		}
	}
	var sig strings.Builder
	for _, m := range msgs {
		sig.WriteString(m.msg + "\n")
	}
	if old, _ := r.invalidSaid.Load(key); old == sig.String() || (old == nil && sig.Len() == 0) {
		return
	}
	r.invalidSaid.Store(key, sig.String())
	for _, m := range msgs {
		r.Recorder.Event(si, corev1.EventTypeWarning, m.reason, m.msg)
	}
}

// reportConflicts sets the Conflict condition on this cluster's export of
// the service, if it exports it: every cluster sees the same merge, so every
// disagreeing export in every cluster gets it.
func (r *Reconciler) reportConflicts(ctx context.Context, key registry.Key, m merge.Result) error {
	id, _, _ := r.Gate.Get()
	exporting := false
	for _, e := range m.Exports {
		exporting = exporting || e.Cluster == id.ClusterID
	}
	if !exporting {
		return nil
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, se); err != nil {
		return client.IgnoreNotFound(err)
	}
	cond := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), Status: metav1.ConditionFalse,
		Reason: m.ConflictReason(), Message: "the exports of all clusters agree", ObservedGeneration: se.Generation}
	if len(m.Conflicts) > 0 {
		cond.Status = metav1.ConditionTrue
		cond.Message = fmt.Sprintf("the exporting clusters %v disagree (%s); the oldest export (cluster %s) wins", m.Clusters(), m.ConflictReason(), m.Exports[0].Cluster)
	}
	if !meta.SetStatusCondition(&se.Status.Conditions, cond) {
		return nil
	}
	if cond.Status == metav1.ConditionTrue {
		r.Recorder.Event(se, corev1.EventTypeWarning, "Conflict", cond.Message)
	}
	return conditions.Apply(ctx, r.Client, se, conditions.ImportManager, mcsv1beta1.ServiceExportConditionConflict)
}

// The permissions the import side needs (generated into config/rbac by make generate).
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=create;update;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=create;update;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// ConditionEndpointsCapped names, on a ServiceImport, the exporting
// clusters whose endpoints passed the import cap (--max-import-endpoints):
// imported up to it, the rest left out. Absent while none does.
const ConditionEndpointsCapped = "EndpointsCapped"

func cappedMessage(e registry.Export) string {
	return fmt.Sprintf("cluster %s exports more than %d endpoint records (address and port) of this Service: imported up to that many, the rest left out; if the export is genuine, raise --max-import-endpoints (chart: mcs.maxImportEndpoints) in the importing clusters", e.Cluster, e.Capped)
}

// setCapped sets or clears the EndpointsCapped condition (its Events are
// said with the invalid records').
func setCapped(si *mcsv1beta1.ServiceImport, exports []registry.Export, status *mcsv1beta1.ServiceImportStatus) {
	var msgs []string
	for _, e := range exports {
		if e.Capped > 0 {
			msgs = append(msgs, cappedMessage(e))
		}
	}
	if len(msgs) == 0 {
		meta.RemoveStatusCondition(&status.Conditions, ConditionEndpointsCapped)
		return
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionEndpointsCapped, Status: metav1.ConditionTrue,
		Reason: "MaxImportEndpoints", Message: strings.Join(msgs, "; "), ObservedGeneration: si.Generation})
}

// ConditionTrafficDistributionIgnored says, on a ServiceImport whose
// exports ask for local-first routing, that this cluster's API server
// dropped the derived Service's spec.trafficDistribution (Kubernetes
// before 1.31, or 1.30 without its feature gate): requests go evenly over
// every cluster. Absent otherwise.
const ConditionTrafficDistributionIgnored = "TrafficDistributionIgnored"

// reportLocalityDropped sets or clears TrafficDistributionIgnored, with a
// Warning Event when it is set.
func (r *Reconciler) reportLocalityDropped(si *mcsv1beta1.ServiceImport, dropped bool, status *mcsv1beta1.ServiceImportStatus) {
	if !dropped {
		meta.RemoveStatusCondition(&status.Conditions, ConditionTrafficDistributionIgnored)
		return
	}
	msg := "the exports ask for local-first routing, and this cluster's API server dropped the derived Service's spec.trafficDistribution (Kubernetes before 1.31, or 1.30 without the ServiceTrafficDistribution gate): requests go evenly over every cluster's endpoints; upgrade this cluster to Kubernetes 1.31 or later"
	if meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionTrafficDistributionIgnored, Status: metav1.ConditionTrue,
		Reason: "NotSupportedByCluster", Message: msg, ObservedGeneration: si.Generation}) {
		r.Recorder.Event(si, corev1.EventTypeWarning, ConditionTrafficDistributionIgnored, msg)
	}
}

// ConditionClustersDrained names, on a ServiceImport, the exporting
// clusters drained for silence (registry.Export.Silent): listed, their
// endpoints kept but not routed to. Absent while none is.
const ConditionClustersDrained = "ClustersDrained"

// reportDrained sets the ClustersDrained condition and, when the drained
// clusters change, a Warning Event naming them; floored are the silent
// clusters kept routed as the Service's last exporters (drainFloor).
func (r *Reconciler) reportDrained(si *mcsv1beta1.ServiceImport, key registry.Key, exports []registry.Export, floored []string, status *mcsv1beta1.ServiceImportStatus) {
	var drained []string
	for _, e := range exports {
		if !e.Silent.IsZero() {
			drained = append(drained, silentFor(e))
		}
	}
	slices.Sort(drained)
	said := strings.Join(drained, ", ")
	if len(floored) > 0 {
		said = "floor: " + strings.Join(floored, ", ")
	}
	prev, _ := r.drainedSaid.Swap(key, said)
	switch {
	case len(floored) > 0:
		msg := strings.Join(floored, ", ") + ": silent past --silent-cluster-ttl, still routed to: no other cluster exports a ready endpoint of this Service, and draining its last exporters would take it dark everywhere"
		if prev != said {
			r.Recorder.Event(si, corev1.EventTypeWarning, "DrainHeld", msg)
		}
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionClustersDrained, Status: metav1.ConditionFalse,
			Reason: "LastExporters", Message: msg, ObservedGeneration: si.Generation})
		return
	case said == "":
		meta.RemoveStatusCondition(&status.Conditions, ConditionClustersDrained)
		return
	case prev != said:
		r.Recorder.Event(si, corev1.EventTypeWarning, "ClusterDrained", "not routed to, kept in the import: "+said+
			": silent past --silent-cluster-ttl while other clusters proved alive (docs/traffic.md)")
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionClustersDrained, Status: metav1.ConditionTrue,
		Reason: "ClusterSilent", Message: said + ": endpoints kept, not routed to, until the cluster proves alive again", ObservedGeneration: si.Generation})
}

func silentFor(e registry.Export) string {
	return fmt.Sprintf("%s (last proof of life %s)", e.Cluster, e.Silent.UTC().Format(time.RFC3339))
}

// drainFloor keeps a Service's last exporters routed: when no cluster
// that proves alive exports a ready endpoint of it, no silent cluster is
// drained (their pods may well serve; draining them would leave the
// Service no endpoint anywhere). It returns the exports to plan with and
// the silent clusters so kept.
func drainFloor(exports []registry.Export) ([]registry.Export, []string) {
	silent := false
	for _, e := range exports {
		if !e.Silent.IsZero() {
			silent = true
			continue
		}
		for _, ep := range e.Endpoints {
			if ep.Ready {
				return exports, nil
			}
		}
	}
	if !silent {
		return exports, nil
	}
	out := slices.Clone(exports)
	var kept []string
	for i := range out {
		if !out[i].Silent.IsZero() {
			kept = append(kept, silentFor(out[i]))
			out[i].Silent = time.Time{}
		}
	}
	slices.Sort(kept)
	return out, kept
}
