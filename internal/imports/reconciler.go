package imports

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

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
		hints = locality.Hints(here, m.Exports)
	}
	d := Plan(key, m, hints)

	// Each object is written at most once a pass (a new ServiceImport
	// twice: made first, as the owner of the rest, then given the derived
	// Service's IPs): its metadata and spec are written last, once what
	// they depend on (the derived Service's IPs, the AWS controller's
	// leftovers gone) is known, then its status.
	si := have
	if si == nil {
		made := d.Import.DeepCopy()
		made.Status = mcsv1beta1.ServiceImportStatus{}
		var err error
		if si, err = r.writeImport(ctx, nil, made); err != nil {
			return reconcile.Result{}, err // nothing else can be owned without it
		}
	} else if si.Labels[LabelManagedBy] != managedByValue && !adoptable(si) {
		_, err := r.writeImport(ctx, si, d.Import)
		return reconcile.Result{}, err
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
		r.Recorder.Event(si, corev1.EventTypeWarning, "ImportWriteFailed", fmt.Sprintf("writing the %s of this import failed: %v", what, err))
	}
	ips := si.Spec.IPs
	localDropped := false
	if err := checkPorts(d.Service); err != nil {
		// Merged from several clusters' exports: what the API server
		// would refuse is said, not sent.
		failed("derived Service", err)
	} else if d.Service != nil {
		svc, err := r.writeService(ctx, si, d.Service)
		failed("derived Service", err)
		if err == nil {
			ips = svc.Spec.ClusterIPs
			localDropped = d.Service.Spec.TrafficDistribution != nil && svc.Spec.TrafficDistribution == nil
		}
	} else {
		failed("derived Service", r.deleteDerived(ctx, key))
		ips = nil
	}
	failed("EndpointSlices", r.writeSlices(ctx, si, key, d.Slices))
	awsDerived, fromAWS := si.Annotations[AWSDerivedServiceAnnotation]
	if fromAWS && len(errs) == 0 {
		// The AWS controller's objects go only once all of ours are in
		// place; its annotation goes with them, in the write below.
		if err := r.dropAWSLeftovers(ctx, si, awsDerived); err != nil {
			return reconcile.Result{}, err
		}
		fromAWS = false
	}
	want := d.Import.DeepCopy()
	want.Status = mcsv1beta1.ServiceImportStatus{}
	want.Spec.IPs = ips
	if fromAWS {
		want.Annotations = withAWSMark(si, want.Annotations)
	}
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[JoinedAnnotation] = joined
	if stored, err := r.writeImport(ctx, si, want); err != nil {
		failed("ServiceImport", err)
	} else {
		if awsDerived != "" && !fromAWS {
			r.Recorder.Event(stored, corev1.EventTypeNormal, "AdoptedFromAWSController",
				fmt.Sprintf("clustermap took this ServiceImport over from the AWS Cloud Map MCS controller and removed its derived Service %s and EndpointSlices", awsDerived))
		}
		si = stored
	}
	status := si.Status.DeepCopy()
	status.Clusters = d.Import.Status.Clusters
	status.EndpointSliceObjects = d.Import.Status.EndpointSliceObjects
	meta.RemoveStatusCondition(&status.Conditions, ConditionRemovalHeld)
	r.reportDrained(si, key, m.Exports, floored, status)
	setCapped(si, m.Exports, status)
	r.reportLocalityDropped(si, localDropped, status)
	meta.SetStatusCondition(&status.Conditions, readyCondition(si.Generation, errors.Join(errs...)))
	if !equality.Semantic.DeepEqual(&si.Status, status) {
		failed("ServiceImport status", r.writeImportStatus(ctx, si, *status))
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

// The permissions the import side needs (generated into config/rbac by make generate).
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=create;update;patch;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
