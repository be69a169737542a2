package imports

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
)

// One pass writes the ServiceImport at most once and its status at most
// once (a new import: made, then given its IPs once the derived Service
// has them), a pass with nothing new writes nothing, and an import taken
// over from the AWS controller loses that controller's annotation in the
// same single apply (after one patch that makes its fields clustermap's).
func TestOnePassWritesTheImportOnce(t *testing.T) {
	writes := map[string]int{}
	vips := 0
	isImport := func(obj client.Object) bool {
		return obj.GetObjectKind().GroupVersionKind().Kind == "ServiceImport" || fmt.Sprintf("%T", obj) == "*v1beta1.ServiceImport"
	}
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithStatusSubresource(&mcsv1beta1.ServiceImport{}).WithReturnManagedFields().
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if err := cl.Patch(ctx, obj, patch, opts...); err != nil {
					return err
				}
				if isImport(obj) {
					writes[string(patch.Type())]++
				}
				svc := &corev1.Service{}
				if obj.GetObjectKind().GroupVersionKind().Kind != "Service" || cl.Get(ctx, client.ObjectKeyFromObject(obj), svc) != nil || len(svc.Spec.ClusterIPs) > 0 {
					return nil
				}
				// The API server allocates the VIP.
				vips++
				svc.Spec.ClusterIPs = []string{fmt.Sprintf("10.96.0.%d", 6+vips)}
				if err := cl.Update(ctx, svc, client.FieldOwner("kube-apiserver")); err != nil {
					return err
				}
				return cl.Get(ctx, client.ObjectKeyFromObject(obj), obj)
			},
			SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				if isImport(obj) {
					writes[sub]++
				}
				return cl.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		}).Build()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "c9", ClusterSet: "set"}, nil)
	view := NewView()
	view.Synced()
	key := registry.Key{Namespace: "ns", Name: "web"}
	view.Set(key, []registry.Export{exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1", "10.0.0.2")})
	r := &Reconciler{Client: c, Gate: gate, View: view, Recorder: record.NewFakeRecorder(100), Namespaces: func(string) bool { return true }}
	pass := func(want string) {
		t.Helper()
		clear(writes)
		if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(writes); got != want {
			t.Errorf("ServiceImport writes %s, want %s", got, want)
		}
	}
	pass("map[application/apply-patch+yaml:2 status:1]")
	si := &mcsv1beta1.ServiceImport{}
	if err := c.Get(context.Background(), client.ObjectKey(key), si); err != nil || len(si.Spec.IPs) != 1 || si.Spec.IPs[0] != "10.96.0.7" {
		t.Fatalf("import %+v %v, want the derived Service's IP", si.Spec, err)
	}
	pass("map[]")
	view.Set(key, []registry.Export{exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")})
	pass("map[]") // only the slices change
	// In one pass: the ports change, the VIP changes (the derived Service
	// was deleted) and the AWS controller's annotation goes (taken over):
	// one apply of the import (there were three writes), after the patch
	// that makes the AWS controller's fields clustermap's.
	si.Annotations[AWSDerivedServiceAnnotation] = "imported-abc"
	if err := c.Update(context.Background(), si, client.FieldOwner("aws-cloud-map-mcs-controller-for-k8s")); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: DerivedName("web")}}); err != nil {
		t.Fatal(err)
	}
	e := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	e.Ports[0].Port = 81
	view.Set(key, []registry.Export{e})
	pass("map[application/apply-patch+yaml:1 application/json-patch+json:1]")
	if err := c.Get(context.Background(), client.ObjectKey(key), si); err != nil || si.Annotations[AWSDerivedServiceAnnotation] != "" ||
		si.Spec.IPs[0] != "10.96.0.8" || si.Spec.Ports[0].Port != 81 {
		t.Errorf("after the pass: annotations %v, spec %+v, %v", si.Annotations, si.Spec, err)
	}
}

// A cluster's export past the import cap is imported up to it: at most
// the cap's slices are written, the import says which cluster passed it
// (condition and Event), and the other cluster's endpoints import whole.
// Back under the cap, the condition goes.
func TestImportCap(t *testing.T) {
	c := importClient()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "c9", ClusterSet: "set"}, nil)
	view := NewView()
	view.Synced()
	key := registry.Key{Namespace: "ns", Name: "web"}
	ips := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s.%d.%d", prefix, i/250, i%250+1))
		}
		return out
	}
	const most = 1000
	big := exportWith("c1", mcsv1beta1.ClusterSetIP, ips("10.1", 5000)...)
	view.Set(key, []registry.Export{big, exportWith("c2", mcsv1beta1.ClusterSetIP, ips("10.2", 10)...)})
	rec := record.NewFakeRecorder(100)
	r := &Reconciler{Client: c, Gate: gate, View: view, Recorder: rec, Namespaces: func(string) bool { return true }, MaxEndpoints: most}
	pass := func() {
		t.Helper()
		if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	slices := &discoveryv1.EndpointSliceList{}
	if err := c.List(context.Background(), slices, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	perCluster := map[string]int{}
	for _, s := range slices.Items {
		perCluster[s.Labels[mcsv1beta1.LabelSourceCluster]] += len(s.Endpoints)
	}
	if perCluster["c1"] != most || perCluster["c2"] != 10 || len(slices.Items) > most/100+1 {
		t.Errorf("%d slices holding %v endpoints per cluster; want c1's cut to %d in at most %d slices, c2's 10", len(slices.Items), perCluster, most, most/100+1)
	}
	si := &mcsv1beta1.ServiceImport{}
	if err := c.Get(context.Background(), client.ObjectKey(key), si); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(si.Status.Conditions, ConditionEndpointsCapped)
	if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "cluster c1 ") || strings.Contains(cond.Message, "c2") {
		t.Fatalf("EndpointsCapped condition %+v; want it naming c1 only", cond)
	}
	if e := <-rec.Events; !strings.Contains(e, ConditionEndpointsCapped) || !strings.Contains(e, "cluster c1 ") {
		t.Errorf("event %q; want EndpointsCapped naming c1", e)
	}
	if len(view.Get(key)[0].Endpoints) != 5000 {
		t.Error("capping changed the view's export")
	}
	view.Set(key, []registry.Export{exportWith("c1", mcsv1beta1.ClusterSetIP, ips("10.1", 5)...)})
	pass()
	if err := c.Get(context.Background(), client.ObjectKey(key), si); err != nil || meta.FindStatusCondition(si.Status.Conditions, ConditionEndpointsCapped) != nil {
		t.Errorf("under the cap the import still says %+v (%v)", si.Status.Conditions, err)
	}
}
