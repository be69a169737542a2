package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	"k8s.io/client-go/util/workqueue"
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
	waiting map[Target]map[ktypes.NamespacedName]*Claim // losers of a claim, with the claim they read
	kick    chan event.GenericEvent
	nsCache map[string]cachedNamespace
}

type cachedNamespace struct {
	ns   Namespace
	read time.Time
}

// entry is what clustermap knows of one registered Service.
type entry struct {
	target  Target
	ns      Namespace
	claim   Claim            // held
	service string           // the Cloud Map service registered in
	current map[string]Attrs // every instance of it, as last read or written
	stale   bool             // re-read the claim and current before planning (drift check)
}

// SetupWithManager reconciles Services on their changes, their
// EndpointSlices' changes, drift ticks and released claims.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.entries = map[ktypes.NamespacedName]*entry{}
	r.waiting = map[Target]map[ktypes.NamespacedName]*Claim{}
	r.kick = make(chan event.GenericEvent, 1024)
	r.nsCache = map[string]cachedNamespace{}
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
		// Failures retry at most 10 s apart (the default backoff reaches
		// minutes), so that a Cloud Map or peer outage ends in seconds.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8,
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, 10*time.Second)}).
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
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Gone before its finalizer was set (it is set right after the
		// claim): what memory holds is let go, or the name stays locked.
		if t := r.remembered(req.NamespacedName); t != nil {
			gone := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: req.Name}}
			if err := r.withdraw(ctx, gone, *t, Owners(r.Cluster, gone)); err != nil {
				return reconcile.Result{}, err
			}
		}
		r.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	owners := Owners(r.Cluster, svc)
	in := Intend(svc, r.Namespaces(svc.Namespace), r.remembered(req.NamespacedName))
	for _, t := range in.Withdraw {
		if err := r.withdraw(ctx, svc, t, owners); err != nil {
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
		switch {
		case in.Invalid != nil:
			log.FromContext(ctx).Error(in.Invalid, "not registering Service in Cloud Map", "service", req.NamespacedName)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonInvalid, in.Invalid.Error()+"; nothing is registered")
		case in.ClearCondition:
			r.clearCondition(ctx, svc)
		}
		return reconcile.Result{}, nil
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

// coversOwners reports whether the recorded owners include every one of
// mark's.
func coversOwners(svc *corev1.Service, mark string) bool {
	rec := strings.Fields(svc.Annotations[AnnotationOwners])
	for _, o := range strings.Fields(mark) {
		if !slices.Contains(rec, o) {
			return false
		}
	}
	return true
}

// remembered is where memory says the Service is registered.
func (r *Reconciler) remembered(key ktypes.NamespacedName) *Target {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.entries[key]; e != nil {
		t := e.target
		return &t
	}
	return nil
}

// unmark drops the finalizer and our annotations once the Service is
// registered nowhere, or the annotation naming t once it is withdrawn
// from there.
func (r *Reconciler) unmark(ctx context.Context, svc *corev1.Service, t Target) error {
	all := t == Target{}
	if all && !controllerutil.ContainsFinalizer(svc, Finalizer) && svc.Annotations[AnnotationRegistered] == "" && svc.Annotations[AnnotationOwners] == "" ||
		!all && svc.Annotations[AnnotationRegistered] != t.String() {
		return nil
	}
	return r.patch(ctx, svc, func() {
		delete(svc.Annotations, AnnotationRegistered)
		if all {
			delete(svc.Annotations, AnnotationOwners)
			controllerutil.RemoveFinalizer(svc, Finalizer)
		}
	})
}

// claim makes sure the Service holds its target's claim, re-reading it
// on drift checks; a nil entry means it does not (yet), with the result
// to return. A Service that lost its claim takes its instances out.
func (r *Reconciler) claim(ctx context.Context, svc *corev1.Service, target Target, owners []string) (*entry, reconcile.Result, error) {
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	held := e != nil && e.target == target
	fresh := held && !e.stale
	r.mu.Unlock()
	if fresh {
		return e, reconcile.Result{}, nil
	}
	cm := CloudMap{r.CloudMap}
	var ns Namespace
	var err error
	if held {
		ns = e.ns
	} else if ns, err = r.namespace(ctx, target.Namespace); errors.Is(err, ErrNamespaceNotFound) {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonNamespaceNotFound, fmt.Sprintf(
			"Cloud Map namespace %q does not exist: create it (private DNS, public DNS or HTTP) or fix annotation %s; nothing is registered", target.Namespace, AnnotationNamespace))
		return nil, reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if err != nil {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, err.Error())
		return nil, reconcile.Result{}, err
	}
	var c Claim
	if held {
		c, err = Verify(ctx, cm, ns.ID, target.Hostname, owners[0], e.claim)
	} else {
		c, err = Acquire(ctx, cm, ns.ID, target.Hostname, owners[0], r.lastSeen(target))
	}
	if err != nil {
		if held {
			r.markStale(e)
		}
		r.claimFailed(ctx, svc, target, err)
		return nil, reconcile.Result{}, err
	}
	if !held && !c.HeldBy(owners) && r.abandoned(ctx, c, target) {
		// A Service of this cluster that no longer wants the name holds it
		// (it was deleted between its claim and its finalizer, while we
		// were down): its lock, and only that one, goes.
		log.FromContext(ctx).Info("deleting an abandoned claim", "target", target.String(), "holder", c.Holder)
		if err = Release(ctx, cm, c, []string{c.Holder}); err == nil {
			c, err = Acquire(ctx, cm, ns.ID, target.Hostname, owners[0], Claim{})
		}
		if err != nil {
			r.claimFailed(ctx, svc, target, err)
			return nil, reconcile.Result{}, err
		}
	}
	if !c.HeldBy(owners) {
		if held || svc.Annotations[AnnotationRegistered] == target.String() {
			// It held the name once (the lock was deleted out of band and
			// someone else took it): its instances go.
			if err := r.withdraw(ctx, svc, target, owners); err != nil {
				r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("deregistering from %s: %v", target, err))
				return nil, reconcile.Result{}, err
			}
			if err := r.unmark(ctx, svc, Target{}); err != nil {
				return nil, reconcile.Result{}, err
			}
		}
		r.mu.Lock()
		delete(r.entries, key)
		if r.waiting[target] == nil {
			r.waiting[target] = map[ktypes.NamespacedName]*Claim{}
		}
		r.waiting[target][key] = &c
		r.mu.Unlock()
		r.report(ctx, svc, metav1.ConditionFalse, ReasonDomainConflict, fmt.Sprintf(
			"%s already claimed by %s; this Service is not registered and takes over when that one lets go", target, c.Holder))
		// Waiters in this cluster are woken on release; others poll.
		return nil, reconcile.Result{RequeueAfter: 15 * time.Second}, nil
	}
	if held {
		r.mu.Lock()
		defer r.mu.Unlock()
		e.claim = c
		return e, reconcile.Result{}, nil
	}
	family := "A"
	if Family(svc) == corev1.IPv6Protocol {
		family = "AAAA"
	}
	id, err := cm.EnsureService(ctx, ns, target.Hostname, owners[0], DNSSettings{TTL: r.TTL, Family: family, SRV: len(svc.Spec.Ports) > 0})
	if err != nil {
		r.claimFailed(ctx, svc, target, err)
		return nil, reconcile.Result{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting[target], key)
	e = &entry{target: target, ns: ns, claim: c, service: id, stale: true}
	r.entries[key] = e
	return e, reconcile.Result{}, nil
}

// abandoned reports whether the claim on target is held by a Service of
// this cluster that is gone, or neither registered there nor asking to be.
func (r *Reconciler) abandoned(ctx context.Context, c Claim, target Target) bool {
	cluster, rest, _ := strings.Cut(c.Holder, "/")
	ns, name, ok := strings.Cut(rest, "/")
	if cluster != r.Cluster || !ok {
		return false
	}
	key := ktypes.NamespacedName{Namespace: ns, Name: name}
	holder := &corev1.Service{}
	switch err := r.Client.Get(ctx, key, holder); {
	case apierrors.IsNotFound(err):
		return r.remembered(key) == nil
	case err != nil:
		return false
	}
	in := Intend(holder, r.Namespaces(ns), r.remembered(key))
	return in.Target != target && !slices.Contains(in.Withdraw, target)
}

// claimFailed reports a failed claim; the namespace is looked up afresh
// next time, in case it was replaced.
func (r *Reconciler) claimFailed(ctx context.Context, svc *corev1.Service, target Target, err error) {
	r.mu.Lock()
	delete(r.nsCache, target.Namespace)
	r.mu.Unlock()
	r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("claiming %s: %v", target, err))
}

// namespace finds a Cloud Map namespace by name, remembering it for a
// drift period: every claim and every waiter's poll needs it, and a
// namespace cannot be replaced while it holds services.
func (r *Reconciler) namespace(ctx context.Context, name string) (Namespace, error) {
	r.mu.Lock()
	c, ok := r.nsCache[name]
	r.mu.Unlock()
	if ok && time.Since(c.read) < r.DriftPeriod {
		return c.ns, nil
	}
	ns, err := CloudMap{r.CloudMap}.FindNamespace(ctx, name)
	if err == nil {
		r.mu.Lock()
		r.nsCache[name] = cachedNamespace{ns, time.Now()}
		r.mu.Unlock()
	}
	return ns, err
}

// lastSeen is the claim a waiter last read on target, which spares a
// read when the lock has not changed.
func (r *Reconciler) lastSeen(target Target) Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.waiting[target] {
		if c != nil {
			return *c
		}
	}
	return Claim{}
}

// sync registers what the Service's ready endpoints lack in Cloud Map and
// deregisters our instances no longer backed by one.
func (r *Reconciler) sync(ctx context.Context, svc *corev1.Service, e *entry, owners []string) (reconcile.Result, error) {
	cm := CloudMap{r.CloudMap}
	r.mu.Lock()
	drift := e.stale && e.current != nil
	refresh := e.stale
	e.stale = false
	r.mu.Unlock()
	if refresh {
		cur, err := cm.Instances(ctx, e.service)
		if IsServiceGone(err) {
			r.forget(client.ObjectKeyFromObject(svc)) // deleted behind our back: made anew
			return reconcile.Result{Requeue: true}, nil
		}
		if err != nil {
			r.markStale(e)
			r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("reading %s: %v", e.target, err))
			return reconcile.Result{}, err
		}
		e.current = cur
	}
	eps := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, eps, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return reconcile.Result{}, err
	}
	desired := Desired(r.Cluster, svc, eps.Items)
	before := e.current
	reg, dereg, err := cm.Apply(ctx, e.service, MakePlan(owners, desired, before), false)
	next := maps.Clone(before)
	for _, id := range reg {
		next[id] = desired[id]
	}
	for _, id := range dereg {
		delete(next, id)
	}
	e.current = next
	r.announce(svc, Changes(e.target, drift, before, desired, reg, dereg))
	if err != nil {
		r.markStale(e)
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("updating %s: %v", e.target, err))
		return reconcile.Result{}, err
	}
	// Every instance carries this name now: older names can be forgotten.
	if mark := RecordOwners(e.claim.Holder, owners[0]); svc.Annotations[AnnotationOwners] != mark {
		if err := r.patch(ctx, svc, func() { metav1.SetMetaDataAnnotation(&svc.ObjectMeta, AnnotationOwners, mark) }); err != nil {
			return reconcile.Result{}, err
		}
	}
	r.report(ctx, svc, metav1.ConditionTrue, ReasonRegistered, fmt.Sprintf("%d instances registered in %s", len(desired), e.target))
	return reconcile.Result{}, nil
}

func (r *Reconciler) announce(svc *corev1.Service, changes []Change) {
	for _, c := range changes {
		instancesChanged.WithLabelValues(c.Action).Add(float64(c.Count))
		r.Recorder.Event(svc, corev1.EventTypeNormal, c.Reason, c.Message)
	}
}

// withdraw takes the Service's instances out of the Cloud Map service at
// had and, if it holds the claim there, deletes the service (if clustermap
// created it) and then the lock, waking any Service waiting for it.
func (r *Reconciler) withdraw(ctx context.Context, svc *corev1.Service, had Target, owners []string) error {
	cm := CloudMap{r.CloudMap}
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	ns, err := r.namespace(ctx, had.Namespace)
	if errors.Is(err, ErrNamespaceNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	found, err := cm.FindServices(ctx, ns, had.Hostname, LockName(had.Hostname))
	if err != nil {
		return err
	}
	if main, ok := found[had.Hostname]; ok {
		cur, err := cm.Instances(ctx, main.ID)
		if err != nil && !IsServiceGone(err) {
			return err
		}
		_, dereg, err := cm.Apply(ctx, main.ID, MakePlan(owners, nil, cur), true)
		r.announce(svc, Changes(had, false, cur, nil, nil, dereg))
		if err != nil {
			return err
		}
	}
	var c Claim
	if lock, ok := found[LockName(had.Hostname)]; ok {
		if e != nil && e.target == had && e.claim.LockID == lock.ID {
			c = e.claim
		} else if c.Holder, err = cm.LockHolder(ctx, lock.ID); err == nil {
			c.LockID = lock.ID
		} else if !errors.Is(err, ErrLockGone) {
			return err
		}
	}
	if c.HeldBy(owners) {
		if main, ok := found[had.Hostname]; ok {
			if err := cm.DeleteIfCreated(ctx, main); err != nil {
				return err
			}
		}
		if err := Release(ctx, cm, c, owners); err != nil {
			return err
		}
	}
	r.mu.Lock()
	if e != nil && e.target == had {
		delete(r.entries, key)
	}
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
