package mcs

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/memory"
	"github.com/clustermap/clustermap/internal/registry/multi"
)

// settle reconciles an import until it asks for nothing sooner than
// later (held imports come back in 30 s), and returns the last result.
func (m *member) settle(t *testing.T, key client.ObjectKey) reconcile.Result {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := m.imports.Reconcile(context.Background(), reconcile.Request{NamespacedName: key})
		if err != nil {
			t.Fatalf("%s: import of %s: %v", m.id.ClusterID, key, err)
		}
		if res.RequeueAfter == 0 || res.RequeueAfter >= 30*time.Second {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: import of %s still waiting (requeue %v)", m.id.ClusterID, key, res.RequeueAfter)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func exportOf(name string, ips ...string) []client.Object {
	svc, sl, se := service(), slice(ips...), serviceExport()
	svc.Name, se.Name = name, name
	sl.Name, sl.Labels[discoveryv1.LabelServiceName] = name+"-abc", name
	return []client.Object{svc, sl, se}
}

// A controller restarted where the registry holds nothing of what the
// cluster imports (a wrong Region or account) keeps every import, says
// why on each, and lets them go once confirmed by hand; back on the right
// registry the imports are as before. Removals the registry vouched for
// while the controller watched are never held, nor a minority of
// removals after a restart.
func TestRestartOnEmptyRegistryKeepsImports(t *testing.T) {
	right, wrong := memory.NewStore(), memory.NewStore()
	names := []string{"cart", "pay", "ship"}
	var objs []client.Object
	for i, n := range names {
		objs = append(objs, exportOf(n, "10.1.0."+string(rune('1'+i)))...)
	}
	a := newMember(t, right, "cluster-a", objs...)
	b := newMember(t, right, "cluster-b")
	for _, n := range names {
		key := client.ObjectKey{Namespace: "shop", Name: n}
		if _, err := a.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
		b.settle(t, key)
		if len(b.importedIPsOf(t, n)) != 1 {
			t.Fatalf("cluster-b does not import %s", n)
		}
	}

	b.start(t, wrong)
	for _, n := range names {
		key := client.ObjectKey{Namespace: "shop", Name: n}
		if res := b.settle(t, key); res.RequeueAfter == 0 {
			t.Errorf("the import of %s was not held", n)
		}
		si := &mcsv1beta1.ServiceImport{}
		if err := b.c.Get(context.Background(), key, si); err != nil {
			t.Fatalf("a restart on an empty registry removed the import of %s: %v", n, err)
		}
		c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionRemovalHeld)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "--region") {
			t.Errorf("%s: RemovalHeld condition %+v", n, c)
		}
		if len(b.importedIPsOf(t, n)) != 1 {
			t.Errorf("a restart on an empty registry changed the endpoints of %s: %v", n, b.importedIPsOf(t, n))
		}
	}
	if ev := drain(b.rec); strings.Count(ev, "Warning RemovalHeld") != len(names) {
		t.Errorf("want one RemovalHeld Event per import, got %q", ev)
	}

	// Confirmed by hand: the deleted import is not made again, the others stay.
	cart := &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}}
	if err := b.c.Delete(context.Background(), cart); err != nil {
		t.Fatal(err)
	}
	b.settle(t, client.ObjectKeyFromObject(cart))
	if err := b.c.Get(context.Background(), client.ObjectKeyFromObject(cart), cart); err == nil {
		t.Error("a confirmed removal came back")
	}

	// Back on the right registry: the held imports are as before, the
	// condition gone; one service unexported while the controller was away
	// of three goes without being held.
	if _, err := a.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "cart"}}); err != nil {
		t.Fatal(err)
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := a.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "ship"}, se); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Delete(context.Background(), se); err != nil {
		t.Fatal(err)
	}
	if _, err := a.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(se)}); err != nil {
		t.Fatal(err)
	}
	b.start(t, right)
	for _, n := range names {
		key := client.ObjectKey{Namespace: "shop", Name: n}
		if res := b.settle(t, key); res.RequeueAfter != 0 {
			t.Errorf("%s held on the right registry", n)
		}
		si := &mcsv1beta1.ServiceImport{}
		err := b.c.Get(context.Background(), key, si)
		switch {
		case n == "ship" && err == nil:
			t.Error("the import of ship, unexported while cluster-b was away, stayed")
		case n != "ship" && err != nil:
			t.Errorf("%s: %v", n, err)
		case n != "ship" && meta.FindStatusCondition(si.Status.Conditions, imports.ConditionRemovalHeld) != nil:
			t.Errorf("%s still has RemovalHeld", n)
		}
	}
}

func (m *member) importedIPsOf(t *testing.T, name string) []string {
	t.Helper()
	var ips []string
	slices := &discoveryv1.EndpointSliceList{}
	if err := m.c.List(context.Background(), slices, client.InNamespace("shop"),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: name, discoveryv1.LabelManagedBy: imports.ManagedBy}); err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			ips = append(ips, e.Addresses...)
		}
	}
	return ips
}

func drain(rec *record.FakeRecorder) string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

// A derived Service the API server refuses does not keep the rest of the
// import from being written: the EndpointSlices and the status are, the
// failure is an error (retried) and a Warning Event.
func TestOneRefusedObjectDoesNotStopTheImport(t *testing.T) {
	store := memory.NewStore()
	a := newMember(t, store, "cluster-a", service(), slice("10.1.0.1"), serviceExport())
	if err := a.reconcileExport(t); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}).
		WithStatusSubresource(&mcsv1beta1.ServiceExport{}, &mcsv1beta1.ServiceImport{}).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if obj.GetObjectKind().GroupVersionKind().Kind == "Service" {
				return apierrors.NewInvalid(schema.GroupKind{Kind: "Service"}, obj.GetName(), nil)
			}
			return c.Patch(ctx, obj, patch, opts...)
		}}).Build()
	b := &member{id: clusterid.Identity{ClusterID: "cluster-b", ClusterSet: "set"}, c: c}
	b.start(t, store)
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var res reconcile.Result
		res, err = b.imports.Reconcile(context.Background(), reconcile.Request{NamespacedName: cart})
		if err != nil || res.RequeueAfter == 0 {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "derived Service") {
		t.Fatalf("reconcile error %v, want the derived Service's", err)
	}
	if got := b.importedIPsOf(t, "cart"); len(got) != 1 {
		t.Errorf("slices not written past the refused Service: %v", got)
	}
	si := &mcsv1beta1.ServiceImport{}
	if err := c.Get(context.Background(), cart, si); err != nil || len(si.Status.Clusters) != 1 {
		t.Errorf("status not written past the refused Service: %+v %v", si.Status, err)
	}
	if ev := drain(b.rec); !strings.Contains(ev, "Warning ImportWriteFailed writing the derived Service") {
		t.Errorf("events %q", ev)
	}
}

// down is a Region out of reach: its watch never reads anything.
type down struct{ registry.Registry }

func (down) Watch(ctx context.Context, _ registry.Sink) error {
	<-ctx.Done()
	return nil
}

// A Region down at a restart holds up only what could be a removal: the
// imports of its clusters stay as they are, while the healthy Region's
// changes and new exports are imported.
// exportedTo exports shop/name from m and settles importer's import of it.
func (m *member) exportedTo(t *testing.T, importer *member, name string) {
	t.Helper()
	key := client.ObjectKey{Namespace: "shop", Name: name}
	if _, err := m.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	importer.settle(t, key)
}

func TestRegionDownAtRestartHoldsOnlyRemovals(t *testing.T) {
	east, west := memory.NewStore(), memory.NewStore()
	a := newMember(t, east, "cluster-a", exportOf("cart", "10.1.0.1")...)
	w := newMember(t, west, "cluster-w", exportOf("pay", "10.2.0.1")...)
	b := newMember(t, east, "cluster-b")
	both := func(westReg registry.Registry) registry.Registry {
		eastReg := east.Registry("set", "cluster-b")
		return &multi.Registry{Home: eastReg, Sources: []multi.Source{{Name: "us-east-1", Registry: eastReg}, {Name: "eu-west-1", Registry: westReg}}}
	}
	b.startWith(t, both(west.Registry("set", "cluster-b")))
	a.exportedTo(t, b, "cart")
	w.exportedTo(t, b, "pay")

	b.startWith(t, both(down{west.Registry("set", "cluster-b")}))
	for _, o := range exportOf("ship", "10.1.0.3") {
		if err := a.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "ship"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ship", "pay"} {
		key := client.ObjectKey{Namespace: "shop", Name: name}
		deadline := time.Now().Add(5 * time.Second)
		for {
			res, err := b.imports.Reconcile(context.Background(), reconcile.Request{NamespacedName: key})
			if err != nil {
				t.Fatal(err)
			}
			if name == "ship" && res.RequeueAfter == 0 {
				break
			}
			if time.Now().After(deadline) {
				if name == "ship" {
					t.Fatalf("a new export of the healthy Region waits on the Region down (requeue %v)", res.RequeueAfter)
				}
				break // pay: held as long as its Region is down
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := b.importedIPsOf(t, "ship"); len(got) != 1 || got[0] != "10.1.0.3" {
		t.Errorf("the healthy Region's new export imported as %v", got)
	}
	if got := b.importedIPsOf(t, "pay"); len(got) != 1 || got[0] != "10.2.0.1" {
		t.Errorf("the down Region's import changed: %v", got)
	}
	if err := b.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "pay"}, &mcsv1beta1.ServiceImport{}); err != nil {
		t.Errorf("the down Region's import went: %v", err)
	}
}

// A Region dropped from the configuration at a restart reads as exporting
// nothing: its clusters' imports are held (RemovalHeld), though the
// Region still read shows other clusters' exports.
func TestRegionDroppedAtRestartHoldsItsImports(t *testing.T) {
	east, west := memory.NewStore(), memory.NewStore()
	a := newMember(t, east, "cluster-a", exportOf("cart", "10.1.0.1")...)
	w := newMember(t, west, "cluster-w", exportOf("pay", "10.2.0.1")...)
	b := newMember(t, east, "cluster-b")
	regions := func(sources ...multi.Source) registry.Registry {
		return &multi.Registry{Home: east.Registry("set", "cluster-b"), Sources: sources}
	}
	eastSrc := multi.Source{Name: "us-east-1", Registry: east.Registry("set", "cluster-b")}
	b.startWith(t, regions(eastSrc, multi.Source{Name: "eu-west-1", Registry: west.Registry("set", "cluster-b")}))
	a.exportedTo(t, b, "cart")
	w.exportedTo(t, b, "pay")
	pay := client.ObjectKey{Namespace: "shop", Name: "pay"}
	si := &mcsv1beta1.ServiceImport{}
	if err := b.c.Get(context.Background(), pay, si); err != nil || si.Annotations[imports.SourceRegionsAnnotation] != "eu-west-1" {
		t.Fatalf("pay's import says Regions %q (%v); want eu-west-1", si.Annotations[imports.SourceRegionsAnnotation], err)
	}

	b.startWith(t, regions(eastSrc)) // eu-west-1 dropped
	if res := b.settle(t, pay); res.RequeueAfter == 0 {
		t.Fatal("pay's import was not held")
	}
	if err := b.c.Get(context.Background(), pay, si); err != nil {
		t.Fatalf("the dropped Region's import went: %v", err)
	}
	if c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionRemovalHeld); c == nil || !strings.Contains(c.Message, "eu-west-1") {
		t.Errorf("RemovalHeld %+v; want it naming eu-west-1", c)
	}
	if got := b.importedIPsOf(t, "cart"); len(got) != 1 {
		t.Errorf("the Region still read lost its import: %v", got)
	}
}
