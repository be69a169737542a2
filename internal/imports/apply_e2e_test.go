//go:build e2e

package imports_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/test/harness"
)

// On a real API server: an import an earlier release wrote (by create and
// update, every field its program's) is taken over by the server-side
// apply writer, so that what the plan no longer has goes (an exported
// label, a port); a pass that changes nothing writes nothing; a
// dual-stack import turned single-stack keeps its first VIP and loses the
// second in place.
func TestAppliedImportsOnAnAPIServer(t *testing.T) {
	env := harness.Clusters(t, 1)
	c := harness.Client(t, env.Clusters[0].Config)
	ctx := context.Background()
	harness.Must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}))
	key := registry.Key{Namespace: "shop", Name: "cart"}
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	admin := mcsv1beta1.ServicePort{Name: "admin", Protocol: corev1.ProtocolTCP, Port: 81}
	export := func(families []corev1.IPFamily, labels map[string]string, ports ...mcsv1beta1.ServicePort) registry.Export {
		e := registry.Export{Cluster: "c1", Type: mcsv1beta1.ClusterSetIP, Ports: ports, Created: time.Unix(1, 0), IPFamilies: families, Labels: labels}
		for _, p := range ports {
			e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: "10.1.0.1", Port: 8000 + p.Port, PortName: p.Name, Protocol: corev1.ProtocolTCP, Ready: true, ServicePort: p})
		}
		return e
	}
	dual := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "c9", ClusterSet: "set"}, nil)
	view := imports.NewView()
	view.Synced()
	r := &imports.Reconciler{Client: c, Gate: gate, View: view, Recorder: record.NewFakeRecorder(100), Namespaces: func(string) bool { return true }}
	pass := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
			t.Fatal(err)
		}
	}
	versions := func() []string {
		t.Helper()
		si, svc, slices := &mcsv1beta1.ServiceImport{}, &corev1.Service{}, &discoveryv1.EndpointSliceList{}
		harness.Must(t, c.Get(ctx, client.ObjectKey(key), si))
		harness.Must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: imports.DerivedName("cart")}, svc))
		harness.Must(t, c.List(ctx, slices, client.InNamespace("shop")))
		out := []string{si.ResourceVersion, svc.ResourceVersion}
		for _, s := range slices.Items {
			out = append(out, s.Name+"@"+s.ResourceVersion)
		}
		return out
	}

	// An earlier release: the same objects, written by create and update.
	view.Set(key, []registry.Export{export(dual, map[string]string{"team": "a"}, http, admin)})
	legacy := &imports.Reconciler{Client: updateOnly{c}, Gate: gate, View: view, Recorder: record.NewFakeRecorder(100), Namespaces: r.Namespaces}
	if _, err := legacy.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
		t.Fatal(err)
	}

	view.Set(key, []registry.Export{export(dual, nil, http)})
	pass()
	si := &mcsv1beta1.ServiceImport{}
	svc := &corev1.Service{}
	harness.Must(t, c.Get(ctx, client.ObjectKey(key), si))
	harness.Must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: imports.DerivedName("cart")}, svc))
	if _, ok := si.Labels["team"]; ok || len(si.Spec.Ports) != 1 || len(svc.Spec.Ports) != 1 {
		t.Errorf("after the takeover: import labels %v ports %v, derived Service ports %v; want the label and port admin gone", si.Labels, si.Spec.Ports, svc.Spec.Ports)
	}
	for _, o := range []client.Object{si, svc} {
		if updaters := kube.Updaters(o, ""); slices.Contains(updaters, kube.LegacyManager()) {
			t.Errorf("%T still has fields of the earlier release's writes: %v", o, o.GetManagedFields())
		}
	}
	if len(svc.Spec.ClusterIPs) != 2 || !slices.Equal(si.Spec.IPs, svc.Spec.ClusterIPs) {
		t.Fatalf("dual-stack: derived Service IPs %v, import IPs %v", svc.Spec.ClusterIPs, si.Spec.IPs)
	}
	before := versions()
	pass()
	if after := versions(); !slices.Equal(before, after) {
		t.Errorf("a pass with nothing new wrote: versions %v, then %v", before, after)
	}

	first := svc.Spec.ClusterIPs[0]
	view.Set(key, []registry.Export{export([]corev1.IPFamily{corev1.IPv4Protocol}, nil, http)})
	pass()
	harness.Must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: imports.DerivedName("cart")}, svc))
	harness.Must(t, c.Get(ctx, client.ObjectKey(key), si))
	if ptr.Deref(svc.Spec.IPFamilyPolicy, "") != corev1.IPFamilyPolicySingleStack || !slices.Equal(svc.Spec.ClusterIPs, []string{first}) || !slices.Equal(si.Spec.IPs, []string{first}) {
		t.Errorf("single-stack: derived Service %v %v, import IPs %v; want only the first VIP %s, kept", svc.Spec.IPFamilyPolicy, svc.Spec.ClusterIPs, si.Spec.IPs, first)
	}
	view.Set(key, []registry.Export{export(dual, nil, http)})
	pass()
	harness.Must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: imports.DerivedName("cart")}, svc))
	if len(svc.Spec.ClusterIPs) != 2 || svc.Spec.ClusterIPs[0] != first {
		t.Errorf("dual-stack again: derived Service IPs %v; want %s and a second", svc.Spec.ClusterIPs, first)
	}
	before = versions()
	pass()
	if after := versions(); !slices.Equal(before, after) {
		t.Errorf("a pass with nothing new wrote: versions %v, then %v", before, after)
	}
}

// updateOnly writes as an earlier release did: by create and update, every
// write its program's (no field manager named).
type updateOnly struct{ client.Client }

func (u updateOnly) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if patch != client.Apply {
		return u.Client.Patch(ctx, obj, patch, opts...)
	}
	cur := obj.DeepCopyObject().(client.Object)
	if err := u.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		if err := client.IgnoreNotFound(err); err != nil {
			return err
		}
		obj.SetResourceVersion("")
		return u.Client.Create(ctx, obj)
	}
	obj.SetResourceVersion(cur.GetResourceVersion())
	return u.Client.Update(ctx, obj)
}

func (u updateOnly) Status() client.SubResourceWriter { return statusUpdateOnly{u.Client} }

type statusUpdateOnly struct{ c client.Client }

func (s statusUpdateOnly) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return s.c.Status().Create(ctx, obj, sub, opts...)
}

func (s statusUpdateOnly) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.c.Status().Update(ctx, obj, opts...)
}

func (s statusUpdateOnly) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	cur := obj.DeepCopyObject().(client.Object)
	if err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return err
	}
	// The status as planned, over the object as it is.
	merged, ok := cur.(*mcsv1beta1.ServiceImport)
	if !ok {
		return s.c.Status().Patch(ctx, obj, patch, opts...)
	}
	var planned mcsv1beta1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, &planned); err != nil {
		return err
	}
	merged.Status = planned.Status
	return s.c.Status().Update(ctx, merged)
}
