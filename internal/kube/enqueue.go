package kube

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// EnqueueEvery maps any event (a channel source's: publish everything
// again, withdraw everything) to a request for every object of newList's
// kind that keep accepts, read from c.
func EnqueueEvery(c client.Reader, newList func() client.ObjectList, keep func(client.Object) bool) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		list := newList()
		if err := c.List(ctx, list); err != nil {
			log.FromContext(ctx).Error(err, "listing every object to look at it again", "list", fmt.Sprintf("%T", list))
			return nil
		}
		var out []reconcile.Request
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			if obj, ok := o.(client.Object); ok && keep(obj) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
			}
			return nil
		})
		return out
	})
}

// EnqueueSameName maps an object to the request of the same namespace and
// name (a Service to its ServiceExport or ServiceImport).
var EnqueueSameName = handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
})

// EnqueueByLabel maps an object to the request in its namespace named by
// its label (an EndpointSlice to its Service: discovery.k8s.io's or
// multicluster's service-name label); none without the label.
func EnqueueByLabel(label string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[label]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
	})
}

// InScope passes the objects of the namespaces a mode serves.
func InScope(namespaces func(string) bool) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool { return namespaces(o.GetNamespace()) })
}

// RetrySoon is the work queue backoff of the reconcilers that write to
// another system (Cloud Map, a peer cluster): failures retry at most 10 s
// apart, so that an outage of it ends in seconds, not in the default
// backoff's minutes.
func RetrySoon() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, 10*time.Second)
}

// Kick asks a controller to reconcile objects by key, from outside its
// watches (peers changed, a drift tick, a claim released).
type Kick chan event.GenericEvent

// NewKick is a kick holding up to n keys not yet taken.
func NewKick(n int) Kick { return make(Kick, n) }

// Source is the kick as a controller's source.
func (k Kick) Source() source.Source {
	return source.Channel(k, &handler.EnqueueRequestForObject{})
}

// Enqueue asks for key, waiting while the kick is full until ctx ends.
func (k Kick) Enqueue(ctx context.Context, key client.ObjectKey) {
	select {
	case k <- event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	case <-ctx.Done():
	}
}
