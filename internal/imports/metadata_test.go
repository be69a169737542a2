package imports

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

func TestExportable(t *testing.T) {
	for key, want := range map[string]bool{
		"team":                                             true,
		"example.com/owner":                                true,
		"app.kubernetes.io/name":                           true,
		"app.kubernetes.io/part-of":                        true,
		"app.kubernetes.io/managed-by":                     false, // clustermap's ownership of the import
		"app.kubernetes.io/instance":                       false, // Argo CD's tracking label
		"clustermap.io/derived-for":                        false,
		"controller.clustermap.io/anything":                false,
		"multicluster.k8s.aws/derived-service":             false,
		"multicluster.kubernetes.io/source-cluster":        false,
		"multicluster.x-k8s.io/whatever":                   false,
		"kubernetes.io/service-name":                       false,
		"endpointslice.kubernetes.io/managed-by":           false,
		"kubectl.kubernetes.io/last-applied-configuration": false,
		"service.kubernetes.io/topology-mode":              false,
		"meta.helm.sh/release-name":                        false,
		"helm.sh/resource-policy":                          false,
		"argocd.argoproj.io/tracking-id":                   false,
		"kustomize.toolkit.fluxcd.io/name":                 false,
		"notk8s.io/x":                                      true, // a domain that only ends alike
	} {
		if got := Exportable(key); got != want {
			t.Errorf("Exportable(%q) = %v, want %v", key, got, want)
		}
	}
}

// A hostile or careless export cannot put keys other controllers or
// clustermap act on onto the import; the rest is copied.
func TestPlanFiltersExportedMetadata(t *testing.T) {
	e := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	e.Labels = map[string]string{"team": "a", LabelManagedBy: "Helm", "app.kubernetes.io/instance": "shop"}
	e.Annotations = map[string]string{"note": "x", AWSDerivedServiceAnnotation: DerivedName("web"), "meta.helm.sh/release-name": "r",
		DerivedServiceAnnotation: "someone-elses"}
	d := Plan(registry.Key{Namespace: "ns", Name: "web"}, merge.Merge([]registry.Export{e}), nil)
	if got := d.Import.Labels; len(got) != 2 || got["team"] != "a" || got[LabelManagedBy] != managedByValue {
		t.Errorf("labels %v", got)
	}
	// The upstream derived-service annotation is clustermap's word alone.
	if got := d.Import.Annotations; len(got) != 2 || got["note"] != "x" || got[DerivedServiceAnnotation] != d.Service.Name {
		t.Errorf("annotations %v, want note and %s=%s", got, DerivedServiceAnnotation, d.Service.Name)
	}
}

// An import annotated with the AWS controller's derived-service key that
// names clustermap's own derived Service keeps it: the clean-up of what
// the AWS controller left removes only that controller's objects (the VIP
// flapped on every pass before).
func TestAdoptionKeepsOurDerivedService(t *testing.T) {
	si := &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1",
		Labels: map[string]string{LabelManagedBy: managedByValue}, Annotations: map[string]string{AWSDerivedServiceAnnotation: DerivedName("web")}}}
	ours := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: DerivedName("web"), Labels: map[string]string{LabelDerivedFor: "web"}}}
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "imported-abc"}}
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).Build()
	r := &Reconciler{Client: c, Recorder: record.NewFakeRecorder(10)}
	ctx := context.Background()
	for _, o := range []client.Object{si, ours, theirs} {
		if o != si {
			if err := controllerutil.SetControllerReference(si, o, c.Scheme()); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.dropAWSLeftovers(ctx, si, si.Annotations[AWSDerivedServiceAnnotation]); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ours), &corev1.Service{}); err != nil {
		t.Fatalf("clustermap's own derived Service was deleted: %v", err)
	}
	// The AWS controller's own derived Service still goes.
	si.Annotations = map[string]string{AWSDerivedServiceAnnotation: theirs.Name}
	if err := c.Update(ctx, si); err != nil {
		t.Fatal(err)
	}
	if err := r.dropAWSLeftovers(ctx, si, si.Annotations[AWSDerivedServiceAnnotation]); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(theirs), &corev1.Service{}); err == nil {
		t.Error("the AWS controller's derived Service stayed")
	}
}
