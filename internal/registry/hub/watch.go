package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry"
)

// serviceIndex indexes ClusterExports by the service they export.
const serviceIndex = "service"

// judgeEvery is how often the watch judges the members' liveness.
const judgeEvery = time.Second

// Watch tells sink every service of the clusterset, then Synced, then each
// change, until ctx ends: from a cache of the clusterset's hub namespace,
// filled by one list (served from the hub's watch cache) and kept by one
// watch, never by a read per service. While the hub cannot be reached
// the cache keeps what it holds: nothing is removed. It renews this
// member's Lease too.
func (r *Registry) Watch(ctx context.Context, sink registry.Sink) error {
	c, err := cache.New(r.cfg, cache.Options{Scheme: Scheme(), DefaultNamespaces: map[string]cache.Config{r.ns: {}},
		DefaultWatchErrorHandler: func(ctx context.Context, rf *toolscache.Reflector, err error) {
			toolscache.DefaultWatchErrorHandler(ctx, rf, err)
			r.read(err)
		}})
	if err != nil {
		return fmt.Errorf("hub cache: %w", err)
	}
	if err := c.IndexField(ctx, &hubv1alpha1.ClusterExport{}, serviceIndex, func(o client.Object) []string {
		return []string{keyOf(o.(*hubv1alpha1.ClusterExport)).String()}
	}); err != nil {
		return err
	}
	proofs := newProofs(r.o.Cluster, r.o.SilentAfter, r.o.Heartbeat)
	exports, err := c.GetInformer(ctx, &hubv1alpha1.ClusterExport{})
	if err != nil {
		return err
	}
	onExport := func(obj any) {
		if o, ok := unwrap(obj).(*hubv1alpha1.ClusterExport); ok {
			r.mark(keyOf(o))
		}
	}
	if _, err := exports.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onExport, UpdateFunc: func(_, o any) { onExport(o) }, DeleteFunc: onExport,
	}); err != nil {
		return err
	}
	leases, err := c.GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return err
	}
	onLease := func(obj any) {
		if l, cluster, ok := memberLease(obj); ok {
			proofs.saw(cluster, l.ResourceVersion, time.Now())
		}
	}
	if _, err := leases.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onLease, UpdateFunc: func(_, o any) { onLease(o) },
		DeleteFunc: func(obj any) {
			if _, cluster, ok := memberLease(obj); ok {
				proofs.gone(cluster)
			}
		},
	}); err != nil {
		return err
	}
	if r.mayReadRegions(ctx) {
		accounts, err := c.GetInformer(ctx, &corev1.ServiceAccount{})
		if err != nil {
			return err
		}
		onAccount := func(obj any) {
			if sa, ok := unwrap(obj).(*corev1.ServiceAccount); ok {
				if cluster, ok := strings.CutPrefix(sa.Name, memberPrefix); ok {
					r.setRegion(cluster, sa.Labels[LabelRegion])
				}
			}
		}
		if _, err := accounts.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: onAccount, UpdateFunc: func(_, o any) { onAccount(o) },
		}); err != nil {
			return err
		}
	}
	go func() { _ = c.Start(ctx) }()
	go r.Heartbeat(ctx)
	if !c.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	w := &watching{r: r, cache: c, sink: sink, proofs: proofs, last: map[registry.Key]map[string]registry.Export{}}
	r.mu.Lock()
	r.synced, r.view = true, c
	keys := r.dirty
	r.dirty = map[registry.Key]bool{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.view = nil // stopped with ctx: publishes read the hub again
		r.mu.Unlock()
	}()
	all := &hubv1alpha1.ClusterExportList{}
	if err := c.List(ctx, all); err != nil {
		return err
	}
	for _, o := range all.Items {
		keys[keyOf(&o)] = true
	}
	w.judge()
	w.tell(ctx, keys)
	sink.Synced()
	tick := time.NewTicker(judgeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-tick.C:
			w.judge()
		}
		r.mu.Lock()
		keys := r.dirty
		r.dirty = map[registry.Key]bool{}
		moved := r.moved
		r.moved = nil
		r.mu.Unlock()
		for key, byCluster := range w.last {
			for cluster := range byCluster {
				if moved[cluster] {
					keys[key] = true
				}
			}
		}
		w.tell(ctx, keys)
	}
}

// mayReadRegions says whether this member may read the members'
// ServiceAccounts, where their Regions are: a hub initialised by an older
// release grants no such read (hub init again), and a watch that cannot
// list them would never sync.
func (r *Registry) mayReadRegions(ctx context.Context) bool {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: r.ns, Verb: "watch", Resource: "serviceaccounts"}}}
	if err := r.c.Create(ctx, review); err != nil || !review.Status.Allowed {
		r.o.Log.Info("members' Regions not read: every member counts as in this cluster's Region; run clustermap hub init again to let members read them", "error", fmt.Sprint(err))
		return false
	}
	return true
}

// unwrap is an object an informer hands over: a deleted one whose last
// state it missed comes in a tombstone.
func unwrap(obj any) any {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return tomb.Obj
	}
	return obj
}

// memberLease is obj as a member's Lease, and the member it names.
func memberLease(obj any) (*coordinationv1.Lease, string, bool) {
	l, ok := unwrap(obj).(*coordinationv1.Lease)
	if !ok {
		return nil, "", false
	}
	cluster, ok := strings.CutPrefix(l.Name, memberPrefix)
	return l, cluster, ok
}

func keyOf(o *hubv1alpha1.ClusterExport) registry.Key {
	return registry.Key{Namespace: o.Spec.Service.Namespace, Name: o.Spec.Service.Name}
}

// watching is one Watch's state: what it last read whole of each export.
type watching struct {
	r      *Registry
	cache  cache.Cache
	sink   registry.Sink
	proofs *proofs
	// last holds each cluster's last whole export of each service: while
	// a write is under way (chunks of two revisions), readers keep it.
	last map[registry.Key]map[string]registry.Export
	// reported is set once OnProofs heard the proofs.
	reported bool
}

// tell reads each service from the cache and tells the sink.
func (w *watching) tell(ctx context.Context, keys map[registry.Key]bool) {
	for _, key := range slices.SortedFunc(maps.Keys(keys), func(a, b registry.Key) int { return strings.Compare(a.String(), b.String()) }) {
		list := &hubv1alpha1.ClusterExportList{}
		if err := w.cache.List(ctx, list, client.MatchingFields{serviceIndex: key.String()}); err != nil {
			w.sink.Unreadable(key)
			continue
		}
		byCluster := map[string][]*hubv1alpha1.ClusterExport{}
		for i := range list.Items {
			o := &list.Items[i]
			// What the admission policy enforces, checked again: a hub
			// without it (older than 1.30, or an admin's hand) must not
			// let one record stand in for another's.
			if o.Name != objectName(o.Spec.Cluster, key, int(o.Spec.Chunk)) {
				w.r.o.Log.Info("skipping a ClusterExport whose name does not follow from its spec (written around the hub's admission policy?)",
					"object", o.Namespace+"/"+o.Name, "cluster", o.Spec.Cluster, "chunk", o.Spec.Chunk)
				continue
			}
			byCluster[o.Spec.Cluster] = append(byCluster[o.Spec.Cluster], o)
		}
		now := map[string]registry.Export{}
		for cluster, objs := range byCluster {
			if !slices.ContainsFunc(objs, func(o *hubv1alpha1.ClusterExport) bool { return o.Spec.Chunk == 0 }) {
				continue // withdrawn (the head goes first), or not yet written whole
			}
			if e, ok := assemble(w.r.o.ClusterSet, objs); ok && e.Key == key {
				now[cluster] = e
			} else if prev, ok := w.last[key][cluster]; ok {
				now[cluster] = prev
			}
		}
		if len(now) == 0 {
			delete(w.last, key)
		} else {
			w.last[key] = now
		}
		w.sink.Set(key, w.exports(now))
	}
}

// exports orders a service's exports by cluster, capped and marked
// silent as the liveness says.
func (w *watching) exports(byCluster map[string]registry.Export) []registry.Export {
	out := make([]registry.Export, 0, len(byCluster))
	for _, cluster := range slices.Sorted(maps.Keys(byCluster)) {
		e := byCluster[cluster]
		if max := w.r.o.MaxImportEndpoints; len(e.Endpoints) > max {
			e.Endpoints, e.Capped = e.Endpoints[:max:max], max
		}
		e.Silent = w.proofs.silentSince(cluster)
		e.Region = w.r.regionOf(cluster)
		out = append(out, e)
	}
	return out
}

// judge drains and restores members, and tells who changed.
func (w *watching) judge() {
	changed := w.proofs.judge()
	for _, cluster := range changed {
		w.changedLiveness(cluster)
	}
	if len(changed) > 0 || !w.reported {
		w.reported = true
		w.r.o.Observer.Proofs(w.proofs.snapshot())
	}
}

// changedLiveness tells again every service a drained or restored
// cluster exports.
func (w *watching) changedLiveness(cluster string) {
	since := w.proofs.silentSince(cluster)
	w.r.o.Observer.Silent(cluster, w.proofs.lastProof(cluster, since), !since.IsZero())
	w.r.o.Log.Info("member liveness changed", "cluster", cluster, "drained", !since.IsZero())
	for key, byCluster := range w.last {
		if _, ok := byCluster[cluster]; ok {
			w.r.mark(key)
		}
	}
}

// Heartbeat renews this member's Lease every Heartbeat until ctx ends.
// Watch runs it; a member that holds no watch (a benchmark's) may too.
func (r *Registry) Heartbeat(ctx context.Context) {
	for {
		lease := &coordinationv1.Lease{
			TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: LeaseName(r.o.Cluster), Labels: map[string]string{hubv1alpha1.ClusterLabel: r.o.Cluster}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(r.o.Cluster), RenewTime: ptr.To(metav1.NewMicroTime(time.Now())),
				LeaseDurationSeconds: ptr.To(int32(r.o.SilentAfter / time.Second))},
		}
		err := r.c.Patch(ctx, lease, client.Apply, client.FieldOwner(fieldOwner), client.ForceOwnership)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.o.Log.Error(err, "renewing this member's Lease on the hub: other members will drain this cluster if it lasts", "lease", r.ns+"/"+lease.Name)
		}
		r.read(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.o.Heartbeat):
		}
	}
}

func (r *Registry) read(err error) {
	r.o.Observer.Read(err)
}
