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
