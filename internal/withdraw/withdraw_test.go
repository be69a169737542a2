package withdraw

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The request turns on with the Lease, heard once by every subscriber,
// and stays on when the Lease goes (the controller publishes again only
// once restarted); a read that fails changes nothing.
func TestSignalLatchesOnTheLease(t *testing.T) {
	ctx := context.Background()
	failing := false
	cl := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if failing {
				return errors.New("apiserver unreachable")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	s := &Signal{}
	a, b := s.Started(), s.Started()
	pending := func() (int, int) {
		n, m := 0, 0
		for {
			select {
			case <-a:
				n++
			case <-b:
				m++
			default:
				return n, m
			}
		}
	}
	s.read(ctx, cl, "clustermap-system", logr.Discard())
	if s.Requested() {
		t.Fatal("requested without the Lease")
	}
	if n, m := pending(); n+m != 0 {
		t.Fatalf("%d, %d changes heard with nothing changed", n, m)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "clustermap-system", Name: LeaseName}}
	if err := cl.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	s.read(ctx, cl, "clustermap-system", logr.Discard())
	s.read(ctx, cl, "clustermap-system", logr.Discard())
	if !s.Requested() {
		t.Fatal("not requested with the Lease")
	}
	if n, m := pending(); n != 1 || m != 1 {
		t.Fatalf("changes heard %d and %d times, want once each", n, m)
	}
	if err := cl.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	failing = true
	s.read(ctx, cl, "clustermap-system", logr.Discard())
	failing = false
	s.read(ctx, cl, "clustermap-system", logr.Discard())
	if !s.Requested() {
		t.Fatal("the withdrawal ended with the Lease: the controller would publish again before it is stopped")
	}
	if n, m := pending(); n+m != 0 {
		t.Fatalf("%d, %d changes heard with the withdrawal kept", n, m)
	}
	// A new controller, no Lease: it publishes.
	if fresh := (&Signal{}); func() bool { fresh.read(ctx, cl, "clustermap-system", logr.Discard()); return fresh.Requested() }() {
		t.Fatal("a new controller without the Lease withdraws")
	}
	var none *Signal
	if none.Requested() {
		t.Fatal("a nil Signal requests")
	}
}
