package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

const (
	// Finalizer holds a registered Service until its instances are gone.
	Finalizer = "clustermap.io/cloudmap-dns"
	// AnnotationRegistered records where a Service holds its claim, so that
	// a changed or removed annotation, even while clustermap was down, is
	// released from the old place.
	AnnotationRegistered = "cloudmap.clustermap.io/registered-as"
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
)

var instancesChanged = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clustermap_cloudmapdns_instances_total",
		Help: "Instances registered and deregistered in Cloud Map DNS namespaces, by action (registered, deregistered, restored, stale_removed).",
	}, []string{"action"})
	metrics.Registry.MustRegister(c)
	return c
}()

var driftCycles = func() prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clustermap_cloudmapdns_drift_cycles_total",
		Help: "Drift checks started (every registered Service re-read from Cloud Map).",
	})
	metrics.Registry.MustRegister(c)
	return c
}()

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

	mu      sync.Mutex
	entries map[ktypes.NamespacedName]*entry
	waiting map[Target]map[ktypes.NamespacedName]bool // losers of a claim
	kick    chan event.GenericEvent
}

// entry is what clustermap knows of one registered Service.
type entry struct {
	target  Target
	svc     Service
	current map[string]Attrs // every instance of the Cloud Map service, as last read or written
	stale   bool             // re-read current before planning (drift check)
}

// SetupWithManager reconciles Services on their changes, their
// EndpointSlices' changes, drift ticks and released claims.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.entries = map[ktypes.NamespacedName]*entry{}
	r.waiting = map[Target]map[ktypes.NamespacedName]bool{}
	r.kick = make(chan event.GenericEvent, 1024)
	if r.DriftPeriod <= 0 {
		r.DriftPeriod = time.Minute
	}
	if r.TTL <= 0 {
		r.TTL = 10
	}
	bySlice := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[discoveryv1.LabelServiceName]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: ktypes.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	inScope := predicate.NewPredicateFuncs(func(o client.Object) bool { return r.Namespaces(o.GetNamespace()) })
	if err := mgr.Add(manager.RunnableFunc(r.drift)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("cloudmapdns").
		For(&corev1.Service{}).
		Watches(&discoveryv1.EndpointSlice{}, bySlice, builder.WithPredicates(inScope)).
		WatchesRawSource(source.Channel(r.kick, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(r)
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

func (r *Reconciler) enqueue(ctx context.Context, k ktypes.NamespacedName) {
	o := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
	select {
	case r.kick <- event.GenericEvent{Object: o}:
	case <-ctx.Done():
	}
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	owner := Owner(r.Cluster, svc)
	target, annotated, invalid := TargetOf(svc)
	keep := annotated && invalid == nil && svc.DeletionTimestamp == nil && r.Namespaces(svc.Namespace)

	// Let go of where the Service was registered, if that changed. The
	// annotation survives restarts; memory covers the annotation's removal.
	for _, had := range r.registeredAt(svc) {
		if keep && had == target {
			continue
		}
		if err := r.release(ctx, svc, had); err != nil {
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("deregistering from %s: %v", had, err))
			return reconcile.Result{}, err
		}
		if svc.Annotations[AnnotationRegistered] == had.String() {
			if err := r.patch(ctx, svc, func() { delete(svc.Annotations, AnnotationRegistered) }); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	if !keep {
		r.forget(req.NamespacedName)
		if controllerutil.ContainsFinalizer(svc, Finalizer) {
			if err := r.patch(ctx, svc, func() { controllerutil.RemoveFinalizer(svc, Finalizer) }); err != nil {
				return reconcile.Result{}, err
			}
		}
		switch {
		case invalid != nil && svc.DeletionTimestamp == nil:
			log.FromContext(ctx).Error(invalid, "not registering Service in Cloud Map", "service", req.NamespacedName)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonInvalid, invalid.Error()+"; nothing is registered")
		case !annotated && meta.FindStatusCondition(svc.Status.Conditions, ConditionRegistered) != nil:
			r.clearCondition(ctx, svc)
		}
		return reconcile.Result{}, nil
	}

	e, res, err := r.claim(ctx, svc, target, owner)
	if e == nil {
		return res, err
	}
	if !controllerutil.ContainsFinalizer(svc, Finalizer) || svc.Annotations[AnnotationRegistered] != target.String() {
		if err := r.patch(ctx, svc, func() {
			controllerutil.AddFinalizer(svc, Finalizer)
			metav1.SetMetaDataAnnotation(&svc.ObjectMeta, AnnotationRegistered, target.String())
		}); err != nil {
			return reconcile.Result{}, err
		}
	}
	return r.sync(ctx, svc, e, owner)
}

// registeredAt is where the Service may hold a claim.
func (r *Reconciler) registeredAt(svc *corev1.Service) []Target {
	var at []Target
	if t, ok := ParseTarget(svc.Annotations[AnnotationRegistered]); ok {
		at = append(at, t)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.entries[client.ObjectKeyFromObject(svc)]; e != nil && (len(at) == 0 || at[0] != e.target) {
		at = append(at, e.target)
	}
	return at
}

// claim makes sure the Service holds its target's Cloud Map service; a nil
// entry means it does not (yet), with the result to return.
func (r *Reconciler) claim(ctx context.Context, svc *corev1.Service, target Target, owner string) (*entry, reconcile.Result, error) {
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	if e != nil && e.target == target && e.svc.Holder == owner {
		return e, reconcile.Result{}, nil
	}
	cm := CloudMap{r.CloudMap}
	ns, err := cm.FindNamespace(ctx, target.Namespace)
	if errors.Is(err, ErrNamespaceNotFound) {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonNamespaceNotFound, fmt.Sprintf(
			"Cloud Map namespace %q does not exist: create it (private DNS, public DNS or HTTP) or fix annotation %s; nothing is registered", target.Namespace, AnnotationNamespace))
		return nil, reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if err != nil {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, err.Error())
		return nil, reconcile.Result{}, err
	}
	family := "A"
	if Family(svc) == corev1.IPv6Protocol {
		family = "AAAA"
	}
	got, err := cm.Claim(ctx, ns, target.Hostname, owner, DNSSettings{TTL: r.TTL, Family: family, SRV: len(svc.Spec.Ports) > 0})
	if err != nil {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("claiming %s: %v", target, err))
		return nil, reconcile.Result{}, err
	}
	r.mu.Lock()
	if got.Holder != owner {
		if r.waiting[target] == nil {
			r.waiting[target] = map[ktypes.NamespacedName]bool{}
		}
		r.waiting[target][key] = true
		r.mu.Unlock()
		r.report(ctx, svc, metav1.ConditionFalse, ReasonDomainConflict, fmt.Sprintf(
			"%s already claimed by %s; this Service is not registered and takes over when that one lets go", target, got.Holder))
		// Waiters in this cluster are woken on release; others poll.
		return nil, reconcile.Result{RequeueAfter: 15 * time.Second}, nil
	}
	defer r.mu.Unlock()
	delete(r.waiting[target], key)
	e = &entry{target: target, svc: got, stale: true}
	r.entries[key] = e
	return e, reconcile.Result{}, nil
}

// sync registers what the Service's ready endpoints lack in Cloud Map and
// deregisters our instances no longer backed by one.
func (r *Reconciler) sync(ctx context.Context, svc *corev1.Service, e *entry, owner string) (reconcile.Result, error) {
	cm := CloudMap{r.CloudMap}
	r.mu.Lock()
	drift := e.stale && e.current != nil
	refresh := e.stale
	e.stale = false
	r.mu.Unlock()
	if refresh {
		cur, err := cm.Instances(ctx, e.svc.ID)
		if IsServiceGone(err) {
			r.forget(client.ObjectKeyFromObject(svc)) // deleted behind our back: claim it anew
			return reconcile.Result{Requeue: true}, nil
		}
		if err != nil {
			r.markStale(e)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("reading %s: %v", e.target, err))
			return reconcile.Result{}, err
		}
		e.current = cur
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, slices, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return reconcile.Result{}, err
	}
	desired := Desired(r.Cluster, svc, slices.Items)
	plan := MakePlan(owner, desired, e.current)
	before := e.current
	reg, dereg, err := cm.Apply(ctx, e.svc.ID, plan, false)
	next := make(map[string]Attrs, len(before))
	for id, a := range before {
		next[id] = a
	}
	for _, id := range reg {
		next[id] = desired[id]
	}
	for _, id := range dereg {
		delete(next, id)
	}
	e.current = next
	r.announce(svc, e.target, drift, before, desired, reg, dereg)
	if err != nil {
		r.markStale(e)
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("updating %s: %v", e.target, err))
		return reconcile.Result{}, err
	}
	r.report(ctx, svc, metav1.ConditionTrue, ReasonRegistered, fmt.Sprintf("%d instances registered in %s", len(desired), e.target))
	return reconcile.Result{}, nil
}

// announce emits Events and counts what one sync changed; what a drift
// check changes is a repair.
func (r *Reconciler) announce(svc *corev1.Service, target Target, drift bool, before, desired map[string]Attrs, reg, dereg []string) {
	emit := func(ids []string, attrs map[string]Attrs, action, reason, format string) {
		if len(ids) > 0 {
			instancesChanged.WithLabelValues(action).Add(float64(len(ids)))
			r.Recorder.Eventf(svc, corev1.EventTypeNormal, reason, format, IPs(attrs, ids), target)
		}
	}
	if drift {
		emit(reg, desired, "restored", ReasonDriftRepaired, "Restored %s in %s")
		emit(dereg, before, "stale_removed", ReasonStaleRemoved, "Deregistered stale IP %s from %s")
		return
	}
	emit(reg, desired, "registered", ReasonRegistered, "Registered %s to %s")
	emit(dereg, before, "deregistered", ReasonDeregistered, "Deregistered %s from %s")
}

// release deregisters the Service's instances from where it was registered
// and gives the claim up, waking any Service waiting for it.
func (r *Reconciler) release(ctx context.Context, svc *corev1.Service, had Target) error {
	cm := CloudMap{r.CloudMap}
	owner := Owner(r.Cluster, svc)
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	var cmSvc Service
	if e != nil && e.target == had {
		cmSvc = e.svc
	} else {
		ns, err := cm.FindNamespace(ctx, had.Namespace)
		if errors.Is(err, ErrNamespaceNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		var found bool
		if cmSvc, found, err = cm.FindService(ctx, ns, had.Hostname); err != nil || !found {
			return err
		}
	}
	cur, err := cm.Instances(ctx, cmSvc.ID)
	if IsServiceGone(err) {
		return nil
	}
	if err != nil {
		return err
	}
	plan := MakePlan(owner, nil, cur)
	_, dereg, err := cm.Apply(ctx, cmSvc.ID, plan, true)
	if len(dereg) > 0 {
		instancesChanged.WithLabelValues("deregistered").Add(float64(len(dereg)))
		r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonDeregistered, "Deregistered %s from %s", IPs(cur, dereg), had)
	}
	if err != nil {
		return err
	}
	if err := cm.Release(ctx, cmSvc, owner); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.entries, key)
	var wake []ktypes.NamespacedName
	for k := range r.waiting[had] {
		wake = append(wake, k)
	}
	r.mu.Unlock()
	for _, k := range wake {
		r.enqueue(ctx, k)
	}
	return nil
}

func (r *Reconciler) forget(key ktypes.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.entries, key)
	for _, w := range r.waiting {
		delete(w, key)
	}
}

func (r *Reconciler) markStale(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.stale = true
}

func (r *Reconciler) patch(ctx context.Context, svc *corev1.Service, change func()) error {
	base := svc.DeepCopy()
	change()
	return r.Client.Patch(ctx, svc, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// report sets the Service's condition and, when it changes, emits an Event
// (Warning for failures) so each problem is said once, not on every retry.
func (r *Reconciler) report(ctx context.Context, svc *corev1.Service, status metav1.ConditionStatus, reason, msg string) {
	old := meta.FindStatusCondition(svc.Status.Conditions, ConditionRegistered)
	if old != nil && old.Status == status && old.Reason == reason && old.Message == msg {
		return
	}
	if status == metav1.ConditionFalse {
		r.Recorder.Event(svc, corev1.EventTypeWarning, reason, msg)
	}
	base := svc.DeepCopy()
	meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: ConditionRegistered, Status: status, Reason: reason, Message: msg, ObservedGeneration: svc.Generation})
	r.patchStatus(ctx, svc, base)
}

func (r *Reconciler) clearCondition(ctx context.Context, svc *corev1.Service) {
	base := svc.DeepCopy()
	meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionRegistered)
	r.patchStatus(ctx, svc, base)
}

// patchStatus writes the status unless the Service changed meanwhile: the
// change brings another reconcile, which writes it then.
func (r *Reconciler) patchStatus(ctx context.Context, svc, base *corev1.Service) {
	err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		log.FromContext(ctx).Error(err, "updating Service status", "service", client.ObjectKeyFromObject(svc))
	}
}

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
