package imports

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/registry"
)

// hintsOf reads the zone hints of every endpoint of the import's slices.
func hintsOf(t *testing.T, c client.Client, key registry.Key) map[string][]string {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := c.List(context.Background(), &list, client.InNamespace(key.Namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			var zones []string
			if ep.Hints != nil {
				for _, z := range ep.Hints.ForZones {
					zones = append(zones, z.Name)
				}
			}
			out[ep.Addresses[0]] = zones
		}
	}
	return out
}

// An import whose exports ask for PreferClose is planned from where this
// cluster's nodes are: its own ready endpoints serve its zones while there
// are any, then the same zone id's; one that asks nothing has no hints.
func TestImportRoutesLocalFirstWhenAsked(t *testing.T) {
	node := func(name, zone, id string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{locality.LabelZone: zone, locality.LabelZoneID: id}}}
	}
	var written []string // source clusters of the slices updated, in order
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithStatusSubresource(&mcsv1beta1.ServiceImport{}).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}, node("n1", "zone-a", "use1-az1"), node("n2", "zone-b", "use1-az2")).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if obj.GetObjectKind().GroupVersionKind().Kind == "EndpointSlice" {
				written = append(written, obj.GetLabels()[mcsv1beta1.LabelSourceCluster])
			}
			return cl.Patch(ctx, obj, patch, opts...)
		}}).WithReturnManagedFields().Build()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "here", ClusterSet: "set"}, nil)
	view := NewView()
	view.Synced()
	r := &Reconciler{Client: c, Gate: gate, View: view, Recorder: record.NewFakeRecorder(100), Namespaces: func(string) bool { return true }, Region: "us-east-1"}
	key := registry.Key{Namespace: "ns", Name: "web"}
	pass := func() {
		t.Helper()
		if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
			t.Fatal(err)
		}
	}
	exports := func(ask bool, localReady bool) []registry.Export {
		local := exportWith("here", mcsv1beta1.ClusterSetIP, "10.9.0.1")
		local.Endpoints[0].Ready, local.Region = localReady, "us-east-1"
		near := exportWith("close", mcsv1beta1.ClusterSetIP, "10.1.0.1")
		near.Endpoints[0].Zone, near.Region = "use1-az1", "us-east-1"
		far := exportWith("far", mcsv1beta1.ClusterSetIP, "10.2.0.1")
		far.Region = "eu-west-1"
		out := []registry.Export{near, far, local}
		if ask {
			for i := range out {
				out[i].TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
			}
		}
		return out
	}
	view.Set(key, exports(false, true))
	pass()
	if got := hintsOf(t, c, key); !reflect.DeepEqual(got, map[string][]string{"10.9.0.1": nil, "10.1.0.1": nil, "10.2.0.1": nil}) {
		t.Fatalf("asked nothing: hints %v, want none", got)
	}
	if got := view.LocalFirst(); len(got) != 0 {
		t.Fatalf("LocalFirst %v", got)
	}
	view.Set(key, exports(true, true))
	pass()
	if got := hintsOf(t, c, key); !reflect.DeepEqual(got, map[string][]string{
		"10.9.0.1": {"zone-a", "zone-b"}, "10.1.0.1": {locality.Nowhere}, "10.2.0.1": {locality.Nowhere}}) {
		t.Fatalf("local ready: hints %v", got)
	}
	if got := view.LocalFirst(); !reflect.DeepEqual(got, []registry.Key{key}) {
		t.Fatalf("LocalFirst %v", got)
	}
	view.Set(key, exports(true, false))
	written = nil
	pass()
	if !reflect.DeepEqual(written, []string{"here", "close"}) {
		t.Errorf("slices updated in the order %v, want here's (turned unready) before close's (now hinted for the zones)", written)
	}
	if got := hintsOf(t, c, key); !reflect.DeepEqual(got, map[string][]string{
		"10.9.0.1": {locality.Nowhere}, "10.1.0.1": {"zone-a", "zone-b"}, "10.2.0.1": {locality.Nowhere}}) {
		t.Fatalf("local not ready: hints %v (zone-b has nobody in its zone id: the Region's)", got)
	}
}

// A drained cluster stays in the import, its endpoints neither ready nor
// serving (kube-proxy routes to none of them), named by the
// ClustersDrained condition and once by a Warning Event; its proof back
// restores it.
func TestSilentClusterIsDrainedNotDropped(t *testing.T) {
	c := importClient()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "here", ClusterSet: "set"}, nil)
	view := NewView()
	view.Synced()
	events := record.NewFakeRecorder(100)
	r := &Reconciler{Client: c, Gate: gate, View: view, Recorder: events, Namespaces: func(string) bool { return true }}
	key := registry.Key{Namespace: "ns", Name: "web"}
	pass := func() *mcsv1beta1.ServiceImport {
		t.Helper()
		return reconciled(t, r, key)
	}
	ready := func() map[string]bool {
		var list discoveryv1.EndpointSliceList
		if err := c.List(context.Background(), &list, client.InNamespace("ns")); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				out[ep.Addresses[0]] = *ep.Conditions.Ready || *ep.Conditions.Serving
			}
		}
		return out
	}
	alive := exportWith("alive", mcsv1beta1.ClusterSetIP, "10.1.0.1")
	silent := exportWith("gone", mcsv1beta1.ClusterSetIP, "10.2.0.1")
	silent.Silent = time.Unix(1_700_000_000, 0)
	view.Set(key, []registry.Export{alive, silent})
	si := pass()
	if got := ready(); !reflect.DeepEqual(got, map[string]bool{"10.1.0.1": true, "10.2.0.1": false}) {
		t.Errorf("ready or serving by address %v, want the drained cluster's neither", got)
	}
	if len(si.Status.Clusters) != 2 {
		t.Errorf("clusters %v, want the drained one listed", si.Status.Clusters)
	}
	cond := meta.FindStatusCondition(si.Status.Conditions, ConditionClustersDrained)
	if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "gone (last proof of life 2023-11-14T22:13:20Z)") {
		t.Errorf("condition %+v", cond)
	}
	pass()
	if n := len(events.Events); n != 1 {
		t.Errorf("%d events after two passes, want one ClusterDrained", n)
	} else if e := <-events.Events; !strings.Contains(e, "Warning ClusterDrained") {
		t.Errorf("event %q", e)
	}
	silent.Silent = time.Time{}
	view.Set(key, []registry.Export{alive, silent})
	si = pass()
	if got := ready(); !got["10.2.0.1"] {
		t.Errorf("restored cluster's endpoint not ready: %v", got)
	}
	if cond := meta.FindStatusCondition(si.Status.Conditions, ConditionClustersDrained); cond != nil {
		t.Errorf("condition left after the restore: %+v", cond)
	}

	// The floor: with the only cluster alive exporting no ready endpoint,
	// the silent one is its Service's last exporter and stays routed to.
	for len(events.Events) > 0 {
		<-events.Events
	}
	idle := exportWith("alive", mcsv1beta1.ClusterSetIP, "10.1.0.1")
	idle.Endpoints[0].Ready = false
	silent.Silent = time.Unix(1_700_000_000, 0)
	view.Set(key, []registry.Export{idle, silent})
	si = pass()
	if got := ready(); !got["10.2.0.1"] {
		t.Errorf("the last exporter's endpoint drained: %v", got)
	}
	cond = meta.FindStatusCondition(si.Status.Conditions, ConditionClustersDrained)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "LastExporters" || !strings.Contains(cond.Message, "gone (last proof of life") {
		t.Errorf("condition under the floor %+v", cond)
	}
	if n := len(events.Events); n != 1 {
		t.Errorf("%d events under the floor, want one DrainHeld", n)
	} else if e := <-events.Events; !strings.Contains(e, "Warning DrainHeld") {
		t.Errorf("event %q", e)
	}
}

// On an API server that drops spec.trafficDistribution (Kubernetes before
// 1.31), an import that asks for local-first routing says so with the
// TrafficDistributionIgnored condition and a Warning Event; on one that
// keeps it, or when nothing is asked, the condition is absent.
func TestLocalityOnAnOlderAPIServerIsReported(t *testing.T) {
	dropping := true
	drop := func(obj client.Object) {
		if u, ok := obj.(*unstructured.Unstructured); ok && u.GetKind() == "Service" && dropping {
			unstructured.RemoveNestedField(u.Object, "spec", "trafficDistribution")
		}
	}
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithStatusSubresource(&mcsv1beta1.ServiceImport{}).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				drop(obj)
				return cl.Patch(ctx, obj, patch, opts...)
			},
		}).WithReturnManagedFields().Build()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "here", ClusterSet: "set"}, nil)
	view := NewView()
	view.Synced()
	events := record.NewFakeRecorder(100)
	r := &Reconciler{Client: c, Gate: gate, View: view, Recorder: events, Namespaces: func(string) bool { return true }, Region: "us-east-1"}
	key := registry.Key{Namespace: "ns", Name: "web"}
	ignored := func(ask bool) *metav1.Condition {
		t.Helper()
		e := exportWith("far", mcsv1beta1.ClusterSetIP, "10.2.0.1")
		if ask {
			e.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
		}
		view.Set(key, []registry.Export{e})
		return meta.FindStatusCondition(reconciled(t, r, key).Status.Conditions, ConditionTrafficDistributionIgnored)
	}
	if got := ignored(false); got != nil {
		t.Fatalf("nothing asked: %+v", got)
	}
	if got := ignored(true); got == nil || got.Status != metav1.ConditionTrue || !strings.Contains(got.Message, "1.31") {
		t.Fatalf("asked, and dropped: %+v, want the condition naming Kubernetes 1.31", got)
	}
	warned := 0
	for len(events.Events) > 0 {
		if e := <-events.Events; strings.Contains(e, ConditionTrafficDistributionIgnored) {
			warned++
		}
	}
	if got := ignored(true); got == nil || warned != 1 || len(events.Events) != 0 {
		t.Fatalf("asked again: %+v, %d Warning Events then %d more; want the condition kept and one Event", got, warned, len(events.Events))
	}
	dropping = false
	if got := ignored(true); got != nil {
		t.Fatalf("kept by the API server: %+v", got)
	}
}
