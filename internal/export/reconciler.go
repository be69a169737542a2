package export

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	"sigs.k8s.io/controller-runtime/pkg/controller"
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
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/withdraw"
)

// Finalizer keeps a ServiceExport until its records left the registry.
const Finalizer = "clustermap.io/export"

// AWSFinalizer is the AWS Cloud Map MCS controller's. clustermap removes it
// once it has published the export itself (its records replace that
// controller's records of this cluster), so that a ServiceExport deleted
// after the switch does not wait forever on a controller that is gone.
const AWSFinalizer = "multicluster.k8s.aws/service-export-finalizer"

// Reconciler publishes ServiceExports.
type Reconciler struct {
	Client   client.Client
	Gate     *clusterid.Gate
	Recorder record.EventRecorder
	// Namespaces decides which namespaces clustermap works in.
	Namespaces func(string) bool
	// Republish, when set, says every export must be published again (the
	// record format changed).
	Republish <-chan event.GenericEvent
	// Orphans, when set, names services the registry holds records of
	// this installation for (Orphaned), which a ServiceExport no longer
	// asks for: they are withdrawn (orphans.go).
	Orphans  <-chan event.GenericEvent
	Orphaned func(registry.Key) bool
	// Rewrites, when set, names exports a write of which the registry
	// accepted and failed later, or made good since: they are published
	// again, and their condition follows.
	Rewrites <-chan event.GenericEvent
	// APIReader confirms at the API server that a ServiceExport is gone
	// before its orphaned records are withdrawn.
	APIReader client.Reader
	// Drift is how often an export is published again though nothing
	// changed here (DefaultDrift when zero): records deleted out of band,
	// or overwritten by a twin with this cluster's id, come back.
	Drift time.Duration
	// Withdrawal, when requested (clustermap uninstall), withdraws every
	// export and lets go of its ServiceExport, which stays.
	Withdrawal *withdraw.Signal
	// Registry names the registry in conditions and Events:
	// registry.CloudMap (when empty) or registry.Hub.
	Registry string
}

// DefaultDrift republishes each export every 10 minutes, give or take a
// tenth: one DiscoverInstances per export when nothing drifted (1,000
// exports: under 2 data-plane calls a second).
const DefaultDrift = 10 * time.Minute

// driftAfter is when an export is published again, spread so that exports
// published together are not again together.
func (r *Reconciler) driftAfter() time.Duration {
	d := cmp.Or(r.Drift, DefaultDrift)
	return d + rand.N(d/10+1)
}

// SetupWithManager watches ServiceExports and the Services and
// EndpointSlices they export.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	sameName, ofService := kube.EnqueueSameName, kube.EnqueueByLabel(discoveryv1.LabelServiceName)
	inScope := kube.InScope(r.Namespaces)
	// Our own status updates need no new reconcile (and no Cloud Map call).
	specOrDeletion := predicate.Or[client.Object](predicate.GenerationChangedPredicate{},
		predicate.NewPredicateFuncs(func(o client.Object) bool { return !o.GetDeletionTimestamp().IsZero() }))
	b := ctrl.NewControllerManagedBy(mgr)
	every := kube.EnqueueEvery(r.Client, func() client.ObjectList { return &mcsv1beta1.ServiceExportList{} },
		func(o client.Object) bool { return r.Namespaces(o.GetNamespace()) })
	if r.Republish != nil {
		b = b.WatchesRawSource(source.Channel(r.Republish, every))
	}
	if r.Withdrawal != nil {
		b = b.WatchesRawSource(source.Channel(r.Withdrawal.Started(), every))
	}
	if r.Orphans != nil {
		b = b.WatchesRawSource(source.Channel(r.Orphans, &handler.EnqueueRequestForObject{}))
	}
	if r.Rewrites != nil {
		b = b.WatchesRawSource(source.Channel(r.Rewrites, &handler.EnqueueRequestForObject{}))
	}
	return b.
		Named("serviceexport").
		// Several exports at once, so that the Cloud Map budget, not one
		// export's round trips in turn, bounds a bulk export.
		WithOptions(controller.Options{MaxConcurrentReconciles: exportWorkers, RateLimiter: kube.RetrySoon()}).
		For(&mcsv1beta1.ServiceExport{}, builder.WithPredicates(inScope, specOrDeletion)).
		Watches(&corev1.Service{}, sameName, builder.WithPredicates(inScope)).
		Watches(&discoveryv1.EndpointSlice{}, ofService, builder.WithPredicates(inScope)).
		Complete(r)
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	id, reg, open := r.Gate.Get()
	if !open {
		// Nothing is exported until the cluster knows who it is.
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := r.Client.Get(ctx, req.NamespacedName, se); apierrors.IsNotFound(err) {
		return r.withdrawOrphan(ctx, reg, registry.Key{Namespace: req.Namespace, Name: req.Name})
	} else if err != nil {
		return reconcile.Result{}, err
	}
	key := registry.Key{Namespace: se.Namespace, Name: se.Name}
	// Conditions unchanged from what was read are not written again.
	before := se.Status.DeepCopy()
	if !se.DeletionTimestamp.IsZero() || r.Withdrawal.Requested() {
		return r.letGo(ctx, se, before, reg)
	}
	if !controllerutil.ContainsFinalizer(se, Finalizer) {
		controllerutil.AddFinalizer(se, Finalizer)
		if err := r.Client.Update(ctx, se); err != nil {
			return reconcile.Result{}, err
		}
	}

	svc := &corev1.Service{}
	err := r.Client.Get(ctx, req.NamespacedName, svc)
	switch {
	case apierrors.IsNotFound(err):
		return r.invalid(ctx, se, before, reg, mcsv1beta1.ServiceExportReasonNoService,
			fmt.Sprintf("Service %s does not exist: create it, or delete this ServiceExport", key))
	case err != nil:
		return reconcile.Result{}, err
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return r.invalid(ctx, se, before, reg, mcsv1beta1.ServiceExportReasonInvalidServiceType,
			fmt.Sprintf("Service %s is of type ExternalName, which cannot be exported", key))
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, slices, client.InNamespace(se.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: se.Name}); err != nil {
		return reconcile.Result{}, err
	}
	zoneIDs, err := r.zoneIDs(ctx, slices.Items)
	if err != nil {
		return reconcile.Result{}, err
	}
	if _, ok := TrafficDistribution(se); !ok {
		r.Recorder.Event(se, corev1.EventTypeWarning, "InvalidTrafficDistribution",
			fmt.Sprintf("annotation %s=%q is not a value clustermap knows: set PreferClose (or remove it); the Service's trafficDistribution is exported meanwhile",
				AnnotationTrafficDistribution, se.Annotations[AnnotationTrafficDistribution]))
	}
	e := Build(id, se, svc, slices.Items, zoneIDs)
	setCondition(se, mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonValid, "the Service can be exported")
	if err := reg.Publish(ctx, e); err != nil {
		return r.retry(ctx, se, before, err)
	}
	ready := 0
	for _, ep := range e.Endpoints {
		if ep.Ready {
			ready++
		}
	}
	if controllerutil.RemoveFinalizer(se, AWSFinalizer) {
		status := se.Status.DeepCopy() // the update answers with the stored status
		if err := r.Client.Update(ctx, se); err != nil {
			return reconcile.Result{}, err
		}
		se.Status = *status
		r.Recorder.Event(se, corev1.EventTypeNormal, "AdoptedFromAWSController",
			"clustermap publishes this export now; the AWS Cloud Map MCS controller's records of this cluster were replaced and its finalizer removed")
		logger.Info("export taken over from the AWS Cloud Map MCS controller", "service", key.String())
	}
	setCondition(se, mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue, mcsv1beta1.ServiceExportReasonExported,
		fmt.Sprintf("exported to clusterset %s with %d endpoint records (%d ready)", id.ClusterSet, len(e.Endpoints), ready))
	return reconcile.Result{RequeueAfter: r.driftAfter()}, r.updateStatus(ctx, se, before)
}

// ReasonWithdrawn is the Ready reason of an export withdrawn because
// clustermap uninstall asked for it.
const ReasonWithdrawn mcsv1beta1.ServiceExportConditionReason = "Withdrawn"

// letGo takes the export's records out of the registry and removes its
// finalizer: the ServiceExport is being deleted, or clustermap uninstall
// asked for a withdrawal, and then it is the user's and stays, saying so.
func (r *Reconciler) letGo(ctx context.Context, se *mcsv1beta1.ServiceExport, before *mcsv1beta1.ServiceExportStatus, reg registry.Registry) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(se, Finalizer) {
		return reconcile.Result{}, nil // never published, or let go already
	}
	key := registry.Key{Namespace: se.Namespace, Name: se.Name}
	if err := reg.Withdraw(ctx, key); err != nil {
		return r.retry(ctx, se, before, err)
	}
	controllerutil.RemoveFinalizer(se, Finalizer)
	if err := r.Client.Update(ctx, se); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !se.DeletionTimestamp.IsZero() {
		log.FromContext(ctx).Info("export withdrawn", "service", key.String())
		return reconcile.Result{}, nil
	}
	log.FromContext(ctx).Info("export withdrawn for clustermap uninstall; the ServiceExport stays", "service", key.String())
	setCondition(se, mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, ReasonWithdrawn,
		"clustermap uninstall withdrew this export from Cloud Map; the ServiceExport is yours and stays (a clustermap controller started after the Lease "+withdraw.LeaseName+" in its namespace is gone publishes it again)")
	return reconcile.Result{}, client.IgnoreNotFound(r.updateStatus(ctx, se, before))
}

// zoneIDs reads the zone id label of the nodes the endpoints are on (node
// metadata, from the cache); nodes without one are left out.
func (r *Reconciler) zoneIDs(ctx context.Context, slices []discoveryv1.EndpointSlice) (map[string]string, error) {
	ids := map[string]string{}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			name := ptr.Deref(ep.NodeName, "")
			if _, seen := ids[name]; seen || name == "" {
				continue
			}
			node := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}}
			if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("reading node %s for its zone id: %w", name, err)
			}
			ids[name] = node.Labels[locality.LabelZoneID]
		}
	}
	return ids, nil
}

// invalid reports a ServiceExport that cannot be exported and withdraws
// whatever it had published: its Service is gone or cannot be exported.
func (r *Reconciler) invalid(ctx context.Context, se *mcsv1beta1.ServiceExport, before *mcsv1beta1.ServiceExportStatus, reg registry.Registry,
	reason mcsv1beta1.ServiceExportConditionReason, msg string) (reconcile.Result, error) {
	if setCondition(se, mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse, reason, msg) {
		r.Recorder.Event(se, corev1.EventTypeWarning, string(reason), msg)
		log.FromContext(ctx).Info("ServiceExport is not valid", "serviceexport", client.ObjectKeyFromObject(se).String(), "reason", reason, "message", msg)
	}
	setCondition(se, mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonFailed, msg)
	key := registry.Key{Namespace: se.Namespace, Name: se.Name}
	err := reg.Withdraw(ctx, key)
	if errors.Is(err, registry.ErrPending) {
		// Withdrawn only once a call finds nothing left to do (a write of
		// the record may still run, and is deregistered after it).
		return reconcile.Result{RequeueAfter: time.Second}, r.updateStatus(ctx, se, before)
	}
	if err != nil {
		return reconcile.Result{}, errors.Join(err, r.updateStatus(ctx, se, before))
	}
	return reconcile.Result{}, r.updateStatus(ctx, se, before)
}

// retry reports a registry failure on the export and tries again later:
// as the registry says for what it refuses, backing off for the rest.
func (r *Reconciler) retry(ctx context.Context, se *mcsv1beta1.ServiceExport, before *mcsv1beta1.ServiceExportStatus, err error) (reconcile.Result, error) {
	var refused registry.Refused
	switch {
	case errors.Is(err, registry.ErrPending):
		return reconcile.Result{RequeueAfter: time.Second}, nil
	case errors.As(err, &refused):
		f := refused.Refusal()
		if setCondition(se, mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, f.Reason, f.Message) {
			r.Recorder.Event(se, corev1.EventTypeWarning, f.Event, f.Message)
			log.FromContext(ctx).Info("the registry refuses the export for now", "serviceexport", client.ObjectKeyFromObject(se).String(),
				"reason", f.Event, "message", f.Message, "fix", cmp.Or(f.Fix, "none needed: it is tried again"), "retryIn", f.Retry)
		}
		return reconcile.Result{RequeueAfter: f.Retry}, r.updateStatus(ctx, se, before)
	default:
		name, reason := cmp.Or(r.Registry, registry.CloudMap), ReasonCloudMapError
		if name == registry.Hub {
			reason = ReasonHubError
		}
		msg := "publishing to " + name + " failed, retrying: " + err.Error()
		if setCondition(se, mcsv1beta1.ServiceExportConditionReady, metav1.ConditionFalse, mcsv1beta1.ServiceExportReasonPending, msg) {
			r.Recorder.Event(se, corev1.EventTypeWarning, reason, msg)
		}
		return reconcile.Result{}, errors.Join(err, r.updateStatus(ctx, se, before))
	}
}

// Events of a failed publish, by registry.
const (
	ReasonCloudMapError = "CloudMapError"
	ReasonHubError      = "HubError"
)

// exportWorkers is how many exports are published at once: an export's
// calls run 8 at a time (cloudmapclient.FanOut) but its steps one after
// another, and at 20 calls/s four keep the budget busy.
const exportWorkers = 4

// updateStatus applies Valid and Ready, when they changed, as the export
// side's own conditions (the import side owns Conflict).
func (r *Reconciler) updateStatus(ctx context.Context, se *mcsv1beta1.ServiceExport, before *mcsv1beta1.ServiceExportStatus) error {
	if equality.Semantic.DeepEqual(before.Conditions, se.Status.Conditions) {
		return nil
	}
	return conditions.Apply(ctx, r.Client, se, conditions.ExportManager, mcsv1beta1.ServiceExportConditionValid, mcsv1beta1.ServiceExportConditionReady)
}

// setCondition sets a condition and tells whether it changed.
func setCondition(se *mcsv1beta1.ServiceExport, t mcsv1beta1.ServiceExportConditionType, s metav1.ConditionStatus, reason mcsv1beta1.ServiceExportConditionReason, msg string) bool {
	return meta.SetStatusCondition(&se.Status.Conditions, metav1.Condition{
		Type: string(t), Status: s, Reason: string(reason), Message: msg, ObservedGeneration: se.Generation,
	})
}

// The permissions the export side needs (generated into config/rbac by make generate).
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=about.k8s.io,resources=clusterproperties,verbs=get;list;watch
