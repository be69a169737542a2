package export

import (
	"context"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// A ServiceExport deleted while its records could not be withdrawn where
// they are (a controller restarted with a wrong Region or account
// withdraws from the wrong registry and drops the finalizer) leaves records
// that every other cluster imports for ever. The registry tells this
// cluster of its own records as it reads every service; those this
// installation wrote (its mark on the service record: never another
// cluster's that shares the id) for a service no ServiceExport asks for
// any more, confirmed at the API server, are withdrawn.

// OrphanTap passes what the registry says to sink, and names to orphans
// each service holding this installation's records (cluster, writer) for
// which cache holds no ServiceExport in a namespace in scope. Orphaned
// answers whether the registry last said so of a service.
type OrphanTap struct {
	Cluster, Writer string
	Cache           client.Reader
	InScope         func(string) bool
	Orphans         chan event.GenericEvent

	mu   sync.Mutex
	ours map[registry.Key]bool
}

// Sink wraps sink.
func (o *OrphanTap) Sink(sink registry.Sink) registry.Sink {
	o.ours = map[registry.Key]bool{}
	return registry.SinkFuncs{
		OnSet: func(key registry.Key, exports []registry.Export) {
			sink.Set(key, exports)
			o.set(key, exports)
		},
		OnUnreadable: sink.Unreadable,
		OnSynced:     sink.Synced,
	}
}

func (o *OrphanTap) set(key registry.Key, exports []registry.Export) {
	ours := false
	for _, e := range exports {
		ours = ours || e.Cluster == o.Cluster && o.Writer != "" && e.Writer == o.Writer
	}
	o.mu.Lock()
	if ours {
		o.ours[key] = true
	} else {
		delete(o.ours, key)
	}
	o.mu.Unlock()
	if !ours || !o.InScope(key.Namespace) {
		return
	}
	err := o.Cache.Get(context.Background(), client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, &mcsv1beta1.ServiceExport{})
	if !apierrors.IsNotFound(err) {
		return // exported here (or unknown): the export's own reconcile decides
	}
	select {
	case o.Orphans <- event.GenericEvent{Object: &mcsv1beta1.ServiceExport{ObjectMeta: objectMeta(key)}}:
	default: // full: the next read of the service names it again
	}
}

// Orphaned says whether the registry last held this installation's
// records of key.
func (o *OrphanTap) Orphaned(key registry.Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ours[key]
}

// withdrawOrphan withdraws this installation's records of a service no
// ServiceExport asks for, once the API server confirms it.
func (r *Reconciler) withdrawOrphan(ctx context.Context, reg registry.Registry, key registry.Key) (reconcile.Result, error) {
	if r.Orphaned == nil || !r.Orphaned(key) || !r.Namespaces(key.Namespace) {
		return reconcile.Result{}, nil
	}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, &mcsv1beta1.ServiceExport{})
	if !apierrors.IsNotFound(err) {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if err := reg.Withdraw(ctx, key); err != nil {
		return reconcile.Result{}, err // retried; ErrPending too
	}
	log.FromContext(ctx).Info("withdrew this cluster's records of a service it no longer exports (its ServiceExport went while they could not be withdrawn, as after a restart with a wrong Region or account)",
		"service", key.String())
	return reconcile.Result{}, nil
}

func objectMeta(key registry.Key) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}
}
