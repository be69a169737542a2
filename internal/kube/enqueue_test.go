package kube

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// One event asks for every object of the kind that keep accepts, each once.
func TestEnqueueEvery(t *testing.T) {
	svc := func(ns, name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(svc("a", "one"), svc("a", "two"), svc("b", "three")).Build()
	h := EnqueueEvery(c, func() client.ObjectList { return &corev1.ServiceList{} }, func(o client.Object) bool { return o.GetNamespace() == "a" })
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	h.Generic(context.Background(), event.GenericEvent{}, q)
	var got []string
	for q.Len() > 0 {
		r, _ := q.Get()
		got = append(got, r.String())
		q.Done(r)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a/one", "a/two"}) {
		t.Fatalf("enqueued %v, want a/one and a/two", got)
	}
}

// The shared mappers ask for the right keys: the same name, the Service a
// label names (none without it); a kick asks for its key; the namespace
// predicate passes what the mode serves.
func TestSharedMappers(t *testing.T) {
	requests := func(h handler.EventHandler, o client.Object) []string {
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		defer q.ShutDown()
		h.Generic(context.Background(), event.GenericEvent{Object: o}, q)
		var got []string
		for q.Len() > 0 {
			r, _ := q.Get()
			got = append(got, r.String())
			q.Done(r)
		}
		return got
	}
	slice := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web-x1", Labels: map[string]string{"kubernetes.io/service-name": "web"}}}
	unlabelled := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "other"}}
	for name, tc := range map[string]struct {
		h    handler.EventHandler
		o    client.Object
		want []string
	}{
		"same name":      {EnqueueSameName, slice, []string{"a/web-x1"}},
		"by label":       {EnqueueByLabel("kubernetes.io/service-name"), slice, []string{"a/web"}},
		"by label, none": {EnqueueByLabel("kubernetes.io/service-name"), unlabelled, nil},
	} {
		if got := requests(tc.h, tc.o); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	k := NewKick(1)
	k.Enqueue(context.Background(), client.ObjectKey{Namespace: "b", Name: "api"})
	if e := <-k; client.ObjectKeyFromObject(e.Object) != (client.ObjectKey{Namespace: "b", Name: "api"}) {
		t.Errorf("kicked %v, want b/api", client.ObjectKeyFromObject(e.Object))
	}
	if !InScope(func(ns string) bool { return ns == "a" }).Generic(event.GenericEvent{Object: slice}) || InScope(func(string) bool { return false }).Generic(event.GenericEvent{Object: slice}) {
		t.Error("InScope passes what its namespaces do not serve, or refuses what they do")
	}
}
