package replication

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/clustermap/clustermap/internal/kube"
)

var writes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "clustermap_syndicate_writes_total",
	Help: "Writes of replicas and EndpointSlices, by cluster (local or a peer's name) and result (ok or error).",
}, []string{"cluster", "result"})

// Metrics are this mode's collectors, registered by Setup.
func Metrics() []prometheus.Collector { return []prometheus.Collector{writes, peerUp, peerTokenExpiry} }

// DefaultGrace is how long replicas from a removed peer stay by default.
const DefaultGrace = 10 * time.Minute

// Reconciler replicates the local cluster's Services to its peers.
type Reconciler struct {
	Client     client.Client
	Cluster    string
	Peers      *Peers
	Recorder   record.EventRecorder
	Namespaces func(string) bool
	// CreateNamespaces lets replication create a namespace a peer lacks.
	CreateNamespaces bool
	// Grace is how long replicas from a peer removed from the directory
	// stay (DefaultGrace when zero).
	Grace time.Duration

	kick   kube.Kick
	absent map[string]time.Time // source clusters of local replicas that are not peers
	// heldSaid is the sources whose replicas were last kept (holdGone).
	heldSaid string
}

// SetupWithManager reconciles a Service name on local Service, Pod and
// EndpointSlice changes, on peer changes, and every 30 s.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Grace <= 0 {
		// Zero is "not set", never "delete at once".
		r.Grace = DefaultGrace
	}
	r.kick = kube.NewKick(4096)
	r.absent = map[string]time.Time{}
	r.Peers.OnObject = func(ns, name string) {
		if r.Namespaces(ns) {
			r.enqueue(ns, name)
		}
	}
	r.Peers.OnChange = func() { r.resyncAll(context.Background()) }
	byServiceName, inScope := kube.EnqueueByLabel(discoveryv1.LabelServiceName), kube.InScope(r.Namespaces)
	// A pod change concerns the Services of its namespace that select it.
	byPod := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		svcs := &corev1.ServiceList{}
		if err := r.Client.List(ctx, svcs, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range svcs.Items {
			if sel, ok := contributionSelector(&svcs.Items[i], ModeOf(&svcs.Items[i])); ok && sel.Matches(labels.Set(o.GetLabels())) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&svcs.Items[i])})
			}
		}
		return reqs
	})
	if err := mgr.Add(manager.RunnableFunc(r.Peers.Start)); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(r.periodic)); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("peers", func(*http.Request) error {
		if down := r.Peers.Down(); len(down) > 0 {
			return fmt.Errorf("peers unreachable: %s", strings.Join(down, ", "))
		}
		return nil
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("syndicate").
		// Only what the mode serves: Reconcile does nothing elsewhere.
		For(&corev1.Service{}, builder.WithPredicates(inScope)).
		Watches(&discoveryv1.EndpointSlice{}, byServiceName, builder.WithPredicates(inScope)).
		Watches(&corev1.Pod{}, byPod, builder.WithPredicates(inScope)).
		WatchesRawSource(r.kick.Source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8, RateLimiter: kube.RetrySoon()}).
		Complete(r)
}

func (r *Reconciler) enqueue(ns, name string) {
	r.kick.Enqueue(context.Background(), client.ObjectKey{Namespace: ns, Name: name})
}

// resyncAll reconciles every local Service and every name a peer holds.
func (r *Reconciler) resyncAll(ctx context.Context) {
	var held [][]corev1.Service
	for _, c := range append([]client.Reader{r.Client}, readers(r.Peers.Reachable())...) {
		svcs := &corev1.ServiceList{}
		if err := c.List(ctx, svcs); err == nil {
			held = append(held, svcs.Items)
		}
	}
	for _, k := range ResyncKeys(held, r.Namespaces) {
		r.enqueue(k.Namespace, k.Name)
	}
}

func readers(peers []*Peer) []client.Reader {
	var out []client.Reader
	for _, p := range peers {
		out = append(out, p.Client)
	}
	return out
}

// periodic resyncs every 30 s and removes replicas of peers gone from the
// directory for longer than the grace period.
func (r *Reconciler) periodic(ctx context.Context) error {
	go wait.UntilWithContext(ctx, r.resyncAll, resyncPeriod)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := r.collectGone(ctx); err != nil {
			log.FromContext(ctx).Error(err, "removing replicas of removed peers")
		}
	}, collectPeriod)
	return nil
}

// How often every Service is replicated again, and replicas of removed
// peers are looked for.
const (
	resyncPeriod  = 30 * time.Second
	collectPeriod = 5 * time.Second
)

func (r *Reconciler) collectGone(ctx context.Context) error {
	svcs := &corev1.ServiceList{}
	if err := r.Client.List(ctx, svcs, client.HasLabels{LabelSourceCluster}); err != nil {
		return err
	}
	eps := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, eps, client.MatchingLabels{discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	var objs []client.Object
	for i := range svcs.Items {
		objs = append(objs, &svcs.Items[i])
	}
	for i := range eps.Items {
		objs = append(objs, &eps.Items[i])
	}
	del, absent, held := CollectGone(objs, GCPolicy{Cluster: r.Cluster, Peer: r.Peers.Configured, InScope: r.Namespaces, Grace: r.Grace}, r.absent, time.Now())
	r.absent = absent
	if len(held) > 0 {
		r.holdGone(ctx, objs, held)
	} else {
		r.heldSaid = ""
	}
	var errs []error
	for _, o := range del {
		if err := r.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		} else if svc, ok := o.(*corev1.Service); ok {
			r.Recorder.Eventf(svc, corev1.EventTypeNormal, "PeerRemoved", "removed: %s left the peers directory %v ago", svc.Labels[LabelSourceCluster], r.Grace)
		}
	}
	return errors.Join(errs...)
}

// holdGone says, once per set of sources, that their replicas are kept
// though no peer of theirs is configured any more.
func (r *Reconciler) holdGone(ctx context.Context, objs []client.Object, held []string) {
	said := strings.Join(held, ",")
	if r.heldSaid == said {
		return
	}
	r.heldSaid = said
	msg := fmt.Sprintf("kept: every source cluster of the replicas here (%s) left the peers directory at once; that is what an emptied or mis-keyed peers Secret looks like. Fix the Secret; if those peers are gone for good, delete their replicas (label %s)", said, LabelSourceCluster)
	log.FromContext(ctx).Info(msg)
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok && slices.Contains(held, svc.Labels[LabelSourceCluster]) {
			r.Recorder.Event(svc, corev1.EventTypeWarning, "PeersAllGone", msg)
		}
	}
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !r.Namespaces(req.Namespace) {
		return reconcile.Result{}, nil
	}
	local, err := r.read(ctx, r.Client, r.Cluster, req, true)
	if err != nil {
		return reconcile.Result{}, err
	}
	var peers []Cluster
	clients := map[string]*Peer{}
	for _, p := range r.Peers.Reachable() {
		c, err := r.read(ctx, p.Client, p.Name, req, false)
		if err != nil {
			log.FromContext(ctx).V(1).Info("peer not read; left out of this plan", "peer", p.Name, "error", err.Error())
			continue // its cache is not ready: left out, so nothing is planned there
		}
		peers = append(peers, c)
		clients[p.Name] = p
	}
	plan := Compute(req.Namespace, req.Name, local, peers)
	for _, e := range plan.Events {
		if local.Service != nil {
			r.Recorder.Event(local.Service, e.Type, e.Reason, e.Message)
		}
	}
	var errs []error
	if err := r.apply(ctx, r.Client, r.Client, plan.Local); err != nil {
		errs = append(errs, err)
	}
	for _, ch := range plan.Peers {
		p := clients[ch.Cluster]
		err := r.apply(ctx, p.Writer, p.Client, ch)
		if err == nil {
			continue
		}
		errs = append(errs, fmt.Errorf("peer %s: %w", ch.Cluster, err))
		if local.Service != nil && !apierrors.IsConflict(err) {
			// A conflict is a user's Service that changed since it was
			// read: the pass is tried again at once, nothing failed.
			r.Recorder.Eventf(local.Service, corev1.EventTypeWarning, "ReplicationFailed", "writing to %s: %v; retrying", ch.Cluster, err)
		}
	}
	return reconcile.Result{}, errors.Join(errs...)
}

// read gathers what one cluster holds for a Service name.
func (r *Reconciler) read(ctx context.Context, c client.Reader, name string, req reconcile.Request, pods bool) (Cluster, error) {
	out := Cluster{Name: name}
	svc := &corev1.Service{}
	switch err := c.Get(ctx, req.NamespacedName, svc); {
	case err == nil:
		out.Service = svc
	case !apierrors.IsNotFound(err):
		return out, err
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := c.List(ctx, slices, client.InNamespace(req.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: req.Name}); err != nil {
		return out, err
	}
	out.Slices = slices.Items
	if pods && out.Service != nil {
		list := &corev1.PodList{}
		if err := c.List(ctx, list, client.InNamespace(req.Namespace)); err != nil {
			return out, err
		}
		out.Pods = list.Items
	}
	return out, nil
}

// FieldOwner is replication's field manager on the replicas and
// EndpointSlices it writes.
const FieldOwner = "clustermap-syndicate"

// apply writes one cluster's changes: a new replica first (its slices need
// its UID), otherwise slices first so the selector goes only once
// clustermap's slice serves; deletions last. Replicas and slices are
// applied (server-side) as FieldOwner; a change to a Service that is not a
// replica of ours (a migration's, on the user's Service) is an update of
// the Service as read, which fails if it changed since.
func (r *Reconciler) apply(ctx context.Context, w client.Client, reader client.Reader, ch Changes) (err error) {
	defer func() {
		writes.WithLabelValues(ch.Cluster, map[bool]string{true: "ok", false: "error"}[err == nil]).Inc()
	}()
	if ch.Empty() {
		return nil
	}
	applier := kube.Applier{Client: w, Manager: FieldOwner}
	var svc *corev1.Service
	if ch.Service != nil && ch.Service.ResourceVersion == "" {
		if err := r.ensureNamespace(ctx, w, ch.Service.Namespace); err != nil {
			return err
		}
		// Planned from a cache that may lag: a Service of that name made
		// since is not applied over (the slices below find it).
		err := w.Get(ctx, client.ObjectKeyFromObject(ch.Service), &corev1.Service{})
		switch {
		case apierrors.IsNotFound(err):
			stored, err := applier.Apply(ctx, nil, ch.Service)
			if err != nil {
				return err
			}
			svc = stored.(*corev1.Service)
		case err != nil:
			return err
		}
	}
	for _, s := range ch.Upsert {
		if svc == nil {
			svc = &corev1.Service{}
			key := client.ObjectKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]}
			err := reader.Get(ctx, key, svc)
			if apierrors.IsNotFound(err) {
				err = w.Get(ctx, key, svc)
			}
			if err != nil {
				return err
			}
		}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID}}
		// Planned from a cache that may lag (a peer's informer can take its
		// backoff, up to 30 s, to catch up after an outage): applied
		// whatever the server holds now.
		held := &discoveryv1.EndpointSlice{}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(s), held); client.IgnoreNotFound(err) != nil {
			return err
		} else if err != nil {
			held = nil
		}
		if _, err := applier.Apply(ctx, heldOrNil(held), s); err != nil {
			return err
		}
	}
	if ch.Service != nil && ch.Service.ResourceVersion != "" {
		if err := r.writeService(ctx, w, applier, ch.Service); err != nil {
			return err
		}
	}
	for _, name := range ch.Delete {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ch.Namespace, Name: name}}
		if err := w.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if ch.DeleteEndpoints {
		e := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: ch.Namespace, Name: ch.Name}} //lint:ignore SA1019 the orphan the mirroring controller copies
		if err := w.Delete(ctx, e); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if ch.DeleteService {
		// Only the replica of ours that was read, not one made since.
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ch.Namespace, Name: ch.Name}}
		if err := w.Delete(ctx, s, client.Preconditions{UID: &ch.DeleteUID}); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// writeService changes a Service as planned: a replica of this cluster's
// is applied; any other (a user's, in a migration) is updated from the
// version read.
func (r *Reconciler) writeService(ctx context.Context, w client.Client, applier kube.Applier, svc *corev1.Service) error {
	if svc.Labels[LabelSourceCluster] != r.Cluster {
		return w.Update(ctx, svc)
	}
	held := &corev1.Service{}
	if err := w.Get(ctx, client.ObjectKeyFromObject(svc), held); err != nil {
		return err
	}
	intent := svc.DeepCopy()
	// What the API server set is not the replica's to say.
	intent.ObjectMeta = metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace, Labels: svc.Labels, Annotations: svc.Annotations}
	intent.Spec.ClusterIPs, intent.Spec.IPFamilies = nil, nil
	if intent.Spec.ClusterIP != corev1.ClusterIPNone { // headless is the replica's to say
		intent.Spec.ClusterIP = ""
	}
	_, err := applier.Apply(ctx, held, intent)
	return err
}

func heldOrNil(s *discoveryv1.EndpointSlice) client.Object {
	if s == nil {
		return nil
	}
	return s
}

func (r *Reconciler) ensureNamespace(ctx context.Context, w client.Client, ns string) error {
	err := w.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	if !r.CreateNamespaces {
		return fmt.Errorf("namespace %s does not exist there; create it, or run with --create-namespaces", ns)
	}
	return client.IgnoreAlreadyExists(w.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
}

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=endpoints,verbs=delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// Creating namespaces (--create-namespaces) is granted apart, only where
// that flag is set: the chart's syndicate.createNamespaces, the kustomize
// component syndicate-create-namespaces.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
