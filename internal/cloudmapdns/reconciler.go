package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/withdraw"
)

const (
	// Finalizer holds a registered Service until its instances are gone.
	Finalizer = "clustermap.io/cloudmap-dns"
	// AnnotationRegistered records where a Service holds its claim, so that
	// a changed or removed annotation, even while clustermap was down, is
	// released from the old place.
	AnnotationRegistered = "cloudmap.clustermap.io/registered-as"
	// AnnotationOwners records the owner values a registered Service's
	// claim and instances carry, so a change of cluster name finds them.
	AnnotationOwners = "cloudmap.clustermap.io/owners"
	// ConditionRegistered is the Service status condition clustermap keeps.
	ConditionRegistered = "cloudmap.clustermap.io/Registered"
)

// Reasons, of conditions and Events.
const (
	ReasonRegistered        = "Registered"
	ReasonDeregistered      = "Deregistered"
	ReasonStaleRemoved      = "StaleRemoved"
	ReasonDriftRepaired     = "DriftRepaired"
	ReasonDomainConflict    = "DomainConflict"
	ReasonNamespaceNotFound = "NamespaceNotFound"
	ReasonInvalid           = "InvalidAnnotation"
	ReasonCloudMapError     = "CloudMapError"
	ReasonWithdrawn         = "Withdrawn"
)

var instancesChanged = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "clustermap_cloudmapdns_instances_total",
	Help: "Instances registered and deregistered in Cloud Map DNS namespaces, by action (registered, deregistered, restored, stale_removed).",
}, []string{"action"})

var driftCycles = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "clustermap_cloudmapdns_drift_cycles_total",
	Help: "Drift checks started (every registered Service re-read from Cloud Map).",
})

// Metrics are this mode's collectors, registered by Setup.
func Metrics() []prometheus.Collector { return []prometheus.Collector{instancesChanged, driftCycles} }

// Reconciler registers annotated Services' ready endpoints in Cloud Map.
type Reconciler struct {
	Client   client.Client
	CloudMap *sd.Client
	// Cluster names this cluster in owners and attributes.
	Cluster     string
	TTL         int64
	DriftPeriod time.Duration
	Recorder    record.EventRecorder
	Namespaces  func(string) bool
	// Withdrawal, when requested, deregisters every Service as if it were
	// out of scope; the Services keep their annotations.
	Withdrawal *withdraw.Signal
	// CloudMapNamespaces, when set, are the only Cloud Map namespaces
	// Services may be registered in.
	CloudMapNamespaces []string
	// OnRead, when set, hears how each read of a service's instances went.
	OnRead func(error)

	mu      sync.Mutex
	entries map[ktypes.NamespacedName]*entry
	waiting map[Target]map[ktypes.NamespacedName]*Claim // losers of a claim, with the claim they read
	kick    kube.Kick
	nsCache map[string]cachedNamespace
	// leading is when this process first reconciled, as leader: the
	// previous leader's registrations may run until OperationRun after.
	leadOnce sync.Once
	leading  time.Time
}

// SetupWithManager reconciles Services on their changes, their
// EndpointSlices' changes, drift ticks and released claims.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.init()
	bySlice := kube.EnqueueByLabel(discoveryv1.LabelServiceName)
	inScope := kube.InScope(r.Namespaces)
	if err := mgr.Add(manager.RunnableFunc(r.drift)); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Withdrawal != nil {
		// Every Service that holds or asks for a registration, looked at
		// again when a withdrawal starts.
		annotated := kube.EnqueueEvery(r.Client, func() client.ObjectList { return &corev1.ServiceList{} }, func(o client.Object) bool {
			_, asks := o.GetAnnotations()[AnnotationHostname]
			return asks || controllerutil.ContainsFinalizer(o, Finalizer)
		})
		b = b.WatchesRawSource(source.Channel(r.Withdrawal.Started(), annotated))
	}
	return b.
		Named("cloudmapdns").
		For(&corev1.Service{}).
		Watches(&discoveryv1.EndpointSlice{}, bySlice, builder.WithPredicates(inScope)).
		WatchesRawSource(r.kick.Source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8, RateLimiter: kube.RetrySoon()}).
		Complete(r)
}

// init makes the reconciler's memory and fills in defaults.
func (r *Reconciler) init() {
	r.entries = map[ktypes.NamespacedName]*entry{}
	r.waiting = map[Target]map[ktypes.NamespacedName]*Claim{}
	r.kick = kube.NewKick(1024)
	r.nsCache = map[string]cachedNamespace{}
	if r.DriftPeriod <= 0 {
		r.DriftPeriod = time.Minute
	}
	if r.TTL <= 0 {
		r.TTL = 10
	}
}

// drift marks every registered Service for a fresh read from Cloud Map,
// once per period: the only way to see instances changed out of band.
func (r *Reconciler) drift(ctx context.Context) error {
	t := time.NewTicker(r.DriftPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		driftCycles.Inc()
		r.mu.Lock()
		var keys []ktypes.NamespacedName
		for k, e := range r.entries {
			e.stale = true
			keys = append(keys, k)
		}
		r.mu.Unlock()
		for _, k := range keys {
			r.enqueue(ctx, k)
		}
	}
}

func (r *Reconciler) enqueue(ctx context.Context, k ktypes.NamespacedName) { r.kick.Enqueue(ctx, k) }

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.leadOnce.Do(func() { r.leading = time.Now() })
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Gone before its finalizer was set (it is set right after the
		// claim): what memory holds is let go, or the name stays locked.
		if t := r.remembered(req.NamespacedName); t != nil {
			gone := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}}
			if err := r.withdraw(ctx, gone, *t, Owners(r.Cluster, gone)); err != nil {
				return settled(err)
			}
		}
		r.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	owners := Owners(r.Cluster, svc)
	withdrawing := r.Withdrawal.Requested()
	in := Intend(svc, r.Namespaces(svc.Namespace) && !withdrawing, r.CloudMapNamespaces, r.remembered(req.NamespacedName))
	for _, t := range in.Withdraw {
		if err := r.withdraw(ctx, svc, t, owners); err != nil {
			if res, err := settled(err); err == nil {
				return res, nil
			}
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("deregistering from %s: %v", t, err))
			return reconcile.Result{}, err
		}
		if err := r.unmark(ctx, svc, t); err != nil {
			return reconcile.Result{}, err
		}
	}
	if in.Target == (Target{}) {
		r.forget(req.NamespacedName)
		if err := r.unmark(ctx, svc, Target{}); err != nil {
			return reconcile.Result{}, err
		}
		_, annotated := svc.Annotations[AnnotationHostname]
		switch {
		case withdrawing && annotated && r.Namespaces(svc.Namespace):
			r.report(ctx, svc, metav1.ConditionFalse, ReasonWithdrawn,
				"clustermap uninstall deregistered this Service from Cloud Map; its annotations stay (a clustermap controller started after the Lease "+withdraw.LeaseName+" in its namespace is gone registers it again)")
		case in.Invalid != nil:
			log.FromContext(ctx).Error(in.Invalid, "not registering Service in Cloud Map", "service", req.NamespacedName)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonInvalid, in.Invalid.Error()+"; nothing is registered")
		case in.ClearCondition:
			r.clearCondition(ctx, svc)
		}
		return reconcile.Result{}, nil
	}
	// The finalizer first: if this process dies between taking the claim
	// and recording it, the Service's deletion still lets the claim go.
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		if err := r.patch(ctx, svc, func() { controllerutil.AddFinalizer(svc, Finalizer) }); err != nil {
			return reconcile.Result{}, err
		}
	}
	e, res, err := r.claim(ctx, svc, in.Target, owners)
	if e == nil {
		return res, err
	}
	// Marked before registering anything: the finalizer and the annotations
	// are how a restarted controller finds what to take out.
	mark := RecordOwners(e.claim.Holder, owners...)
	if !controllerutil.ContainsFinalizer(svc, Finalizer) || svc.Annotations[AnnotationRegistered] != in.Target.String() || !coversOwners(svc, mark) {
		if err := r.patch(ctx, svc, func() {
			controllerutil.AddFinalizer(svc, Finalizer)
			metav1.SetMetaDataAnnotation(&svc.ObjectMeta, AnnotationRegistered, in.Target.String())
			metav1.SetMetaDataAnnotation(&svc.ObjectMeta, AnnotationOwners, mark)
		}); err != nil {
			return reconcile.Result{}, err
		}
	}
	return r.sync(ctx, svc, e, owners)
}

// sync registers what the Service's ready endpoints lack in Cloud Map and
// deregisters our instances no longer backed by one.
func (r *Reconciler) sync(ctx context.Context, svc *corev1.Service, e *entry, owners []string) (reconcile.Result, error) {
	cm := CloudMap{r.CloudMap}
	r.mu.Lock()
	refresh := e.stale
	e.stale = false
	r.mu.Unlock()
	var remembered map[string]Attrs // when Cloud Map is read: memory before the read
	if !e.rereadAt.IsZero() && !time.Now().Before(e.rereadAt) {
		refresh, e.rereadAt = true, time.Time{}
	}
	if len(e.running) > 0 && !time.Now().Before(e.checkAt) {
		running, failed := cm.Ended(ctx, e.running)
		e.running, e.checkAt = running, time.Now().Add(time.Second)
		if len(running) == 0 && e.readMidWrite {
			refresh, e.readMidWrite = true, false
		}
		if failed != nil {
			// Memory counted those writes: what Cloud Map holds is read
			// again, and what lacks is written again.
			e.failed = failed
			refresh = true
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf(
				"Cloud Map accepted a write to %s, then failed it (%v); written again", e.target, failed))
		}
	}
	if refresh {
		// Whichever read finds it (a drift check, or a read again once
		// writes ended), an instance memory did not hold is stale, one it
		// held and Cloud Map lacks is restored.
		r.mu.Lock()
		remembered = e.current
		r.mu.Unlock()
		cur, err := cm.Instances(ctx, e.service)
		if r.OnRead != nil {
			r.OnRead(err)
		}
		if IsServiceGone(err) {
			r.forget(client.ObjectKeyFromObject(svc)) // deleted behind our back: made anew
			return reconcile.Result{RequeueAfter: time.Millisecond}, nil
		}
		if err != nil {
			r.markStale(e)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("reading %s: %v", e.target, err))
			return reconcile.Result{}, err
		}
		e.current = cur
		// The listing shows only finished operations: it misses a write
		// still running (ours, the previous leader's, or one whose call
		// failed but was made), whose instance, if its endpoint went
		// meanwhile, would stay until the next drift check. Read again
		// once such writes have ended.
		e.readMidWrite = len(e.running) > 0
		if until := r.unseenUntil(e); time.Now().Before(until) {
			e.rereadAt = until
		}
	}
	eps := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, eps, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return reconcile.Result{}, err
	}
	desired := Desired(r.Cluster, svc, eps.Items)
	before := e.current
	done, err := cm.Apply(ctx, e.service, Diff(owners, desired, before), false)
	next := maps.Clone(before)
	for _, id := range done.Registered {
		next[id] = desired[id]
	}
	for _, id := range done.Deregistered {
		delete(next, id)
	}
	e.current = next
	if len(done.Running) > 0 {
		e.running = append(e.running, done.Running...)
		e.checkAt = time.Now().Add(operationCheck)
	}
	r.announce(svc, Changes(e.target, remembered, before, desired, done.Registered, done.Deregistered))
	if err != nil && onlyBusy(err) {
		// A write of those instances is still running (Cloud Map answers
		// DuplicateRequest while its operation runs): memory leaves them
		// out, so they are written again a second later, with no error
		// (a read now would not show the running write yet).
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		r.markStale(e)
		e.unsureAt = time.Now()
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("updating %s: %v", e.target, err))
		return reconcile.Result{}, err
	}
	// Every instance carries this name now: older names can be forgotten.
	if mark := RecordOwners(e.claim.Holder, owners[0]); svc.Annotations[AnnotationOwners] != mark {
		if err := r.patch(ctx, svc, func() { metav1.SetMetaDataAnnotation(&svc.ObjectMeta, AnnotationOwners, mark) }); err != nil {
			return reconcile.Result{}, err
		}
	}
	var res reconcile.Result
	if len(e.running) > 0 {
		res.RequeueAfter = time.Until(e.checkAt) + time.Millisecond
	} else {
		e.failed = nil // every write made again ended well
	}
	if wait := time.Until(e.rereadAt) + time.Millisecond; wait > 0 && (res.RequeueAfter == 0 || wait < res.RequeueAfter) {
		res.RequeueAfter = wait
	}
	if e.failed != nil {
		return res, nil // the condition says so until the writes made again succeed
	}
	r.report(ctx, svc, metav1.ConditionTrue, ReasonRegistered, fmt.Sprintf("%d instances registered in %s", len(desired), e.target))
	return res, nil
}

// operationCheck is how long after a write its operation is looked up:
// inside the AWS profile's 0.5-4 s most have ended by then, so most cost
// one GetOperation.
const operationCheck = 3 * time.Second

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// onlyBusy tells whether every error joined in err is Cloud Map's
// DuplicateRequest: an operation on the instance still runs.
func onlyBusy(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !onlyBusy(e) {
				return false
			}
		}
		return len(joined.Unwrap()) > 0
	}
	var busy *types.DuplicateRequest
	return errors.As(err, &busy)
}
