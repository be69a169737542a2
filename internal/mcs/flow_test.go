package mcs

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/memory"
)

// member is one cluster of an in-process clusterset: a fake API server,
// the export and import reconcilers, its registry over a shared store.
type member struct {
	id      clusterid.Identity
	c       client.Client
	export  *export.Reconciler
	imports *imports.Reconciler
	rec     *record.FakeRecorder
}

func newMember(t *testing.T, store *memory.Store, cluster string, objs ...client.Object) *member {
	t.Helper()
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&mcsv1beta1.ServiceExport{}, &mcsv1beta1.ServiceImport{}).Build()
	m := &member{id: clusterid.Identity{ClusterID: cluster, ClusterSet: "set"}, c: c}
	m.start(t, store)
	return m
}

// start runs the member's controllers (again) over a store: a restart
// keeps what the cluster holds and forgets what the controllers knew.
func (m *member) start(t *testing.T, store *memory.Store) {
	m.startWith(t, store.Registry(m.id.ClusterSet, m.id.ClusterID))
}

func (m *member) startWith(t *testing.T, reg registry.Registry) {
	gate := &clusterid.Gate{}
	gate.Open(m.id, reg)
	view := imports.NewView()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = reg.Watch(ctx, view) }()
	m.rec = record.NewFakeRecorder(100)
	all := func(string) bool { return true }
	m.export = &export.Reconciler{Client: m.c, Gate: gate, Recorder: m.rec, Namespaces: all}
	m.imports = &imports.Reconciler{Client: m.c, Gate: gate, View: view, Recorder: m.rec, Namespaces: all}
}

var cart = client.ObjectKey{Namespace: "shop", Name: "cart"}

func (m *member) reconcileExport(t *testing.T) error {
	t.Helper()
	_, err := m.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: cart})
	return err
}

// reconcileImport waits for the view to have synced, then reconciles the
// import of cart once.
func (m *member) reconcileImport(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := m.imports.Reconcile(context.Background(), reconcile.Request{NamespacedName: cart})
		if err != nil {
			t.Fatalf("%s: import: %v", m.id.ClusterID, err)
		}
		if res.RequeueAfter == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: import still waiting (requeue %v)", m.id.ClusterID, res.RequeueAfter)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func service() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.0.0.10", IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
}

func slice(ips ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-abc",
		Labels: map[string]string{discoveryv1.LabelServiceName: "cart"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func serviceExport() *mcsv1beta1.ServiceExport {
	return &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", CreationTimestamp: metav1.Now()}}
}

// importedIPs lists the endpoint addresses cluster m imports for cart,
// from every source cluster.
func (m *member) importedIPs(t *testing.T) map[string]string {
	t.Helper()
	slices := &discoveryv1.EndpointSliceList{}
	if err := m.c.List(context.Background(), slices, client.InNamespace("shop"), client.MatchingLabels{mcsv1beta1.LabelServiceName: "cart"}); err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{}
	for _, s := range slices.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != imports.ManagedBy {
			continue
		}
		for _, e := range s.Endpoints {
			ips[e.Addresses[0]] = s.Labels[mcsv1beta1.LabelSourceCluster]
		}
	}
	return ips
}

// A ServiceExport in one cluster becomes, through the registry, a
// ServiceImport with a derived Service and EndpointSlices in every
// cluster; a registry outage changes no import; unexporting removes them.
func TestExportRegistryMergeImport(t *testing.T) {
	store := memory.NewStore()
	a := newMember(t, store, "cluster-a", service(), slice("10.1.0.1", "10.1.0.2"), serviceExport())
	b := newMember(t, store, "cluster-b")

	if err := a.reconcileExport(t); err != nil {
		t.Fatalf("export: %v", err)
	}
	if got := store.Exports("set", registry.Key(cart)); len(got) != 1 || len(got[0].Endpoints) != 2 {
		t.Fatalf("registry holds %+v, want cluster-a's export with 2 endpoints", got)
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := a.c.Get(context.Background(), cart, se); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady)); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("ServiceExport Ready = %+v, want True", c)
	}

	for _, m := range []*member{a, b} {
		m.reconcileImport(t)
		si := &mcsv1beta1.ServiceImport{}
		if err := m.c.Get(context.Background(), cart, si); err != nil {
			t.Fatalf("%s: no ServiceImport: %v", m.id.ClusterID, err)
		}
		if si.Spec.Type != mcsv1beta1.ClusterSetIP || len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 {
			t.Errorf("%s: import spec %+v", m.id.ClusterID, si.Spec)
		}
		if len(si.Status.Clusters) != 1 || si.Status.Clusters[0].Cluster != "cluster-a" {
			t.Errorf("%s: import clusters %+v", m.id.ClusterID, si.Status.Clusters)
		}
		if err := m.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: imports.DerivedName("cart")}, &corev1.Service{}); err != nil {
			t.Errorf("%s: no derived Service: %v", m.id.ClusterID, err)
		}
		if got := m.importedIPs(t); len(got) != 2 || got["10.1.0.1"] != "cluster-a" || got["10.1.0.2"] != "cluster-a" {
			t.Errorf("%s: imported endpoints %v", m.id.ClusterID, got)
		}
	}

	// An endpoint goes while the registry is down: the export reports the
	// failure, and no import changes.
	cur := &discoveryv1.EndpointSlice{}
	if err := a.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "cart-abc"}, cur); err != nil {
		t.Fatal(err)
	}
	cur.Endpoints = cur.Endpoints[:1]
	if err := a.c.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	store.Fail(errors.New("registry down"))
	if err := a.reconcileExport(t); err == nil {
		t.Fatal("export during an outage reported success")
	}
	b.reconcileImport(t)
	if got := b.importedIPs(t); len(got) != 2 {
		t.Fatalf("an outage changed cluster-b's import: %v", got)
	}
	store.Fail(nil)
	if err := a.reconcileExport(t); err != nil {
		t.Fatal(err)
	}
	b.reconcileImport(t)
	if got := b.importedIPs(t); len(got) != 1 || got["10.1.0.1"] == "" {
		t.Fatalf("after the outage cluster-b imports %v, want 10.1.0.1 only", got)
	}

	// Unexport: the finalizer withdraws, then every import goes.
	if err := a.c.Get(context.Background(), cart, se); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Delete(context.Background(), se); err != nil {
		t.Fatal(err)
	}
	if err := a.reconcileExport(t); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Get(context.Background(), cart, se); !apierrors.IsNotFound(err) {
		t.Fatalf("ServiceExport still there after withdrawal: %v", err)
	}
	for _, m := range []*member{a, b} {
		m.reconcileImport(t)
		if err := m.c.Get(context.Background(), cart, &mcsv1beta1.ServiceImport{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: ServiceImport after unexport: %v", m.id.ClusterID, err)
		}
		if got := m.importedIPs(t); len(got) != 0 {
			t.Errorf("%s: endpoints after unexport: %v", m.id.ClusterID, got)
		}
	}
}

// An export is published again every drift period though nothing changed
// here: records deleted out of band (or overwritten by a twin with this
// cluster's id) come back then.
func TestExportDriftRepublishes(t *testing.T) {
	store := memory.NewStore()
	a := newMember(t, store, "cluster-a", service(), slice("10.1.0.1"), serviceExport())
	res, err := a.export.Reconcile(context.Background(), reconcile.Request{NamespacedName: cart})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.RequeueAfter; d < export.DefaultDrift || d > export.DefaultDrift*11/10 {
		t.Errorf("published export requeued after %v; want the drift period, %v plus up to a tenth", d, export.DefaultDrift)
	}
	// Deleted out of band, as by another writer of the registry.
	if err := store.Registry("set", "cluster-a").Withdraw(context.Background(), registry.Key(cart)); err != nil {
		t.Fatal(err)
	}
	if err := a.reconcileExport(t); err != nil {
		t.Fatal(err)
	}
	if got := store.Exports("set", registry.Key(cart)); len(got) != 1 {
		t.Errorf("after the drift pass the registry holds %+v; want cluster-a's export back", got)
	}
}
