//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

// What `kubectl apply -k` does on a fresh cluster: kustomize builds the
// tree, the apiserver validates and stores every object in kustomize's
// order. config/dns goes for real first (it brings its namespace); every
// other tree is a server-side dry run (RBAC rules, Deployment, CRDs
// validated, nothing stored).
func TestKustomizeApplies(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	cl := harness.Client(t, env.Clusters[0].Config)
	apply := func(dir string, opts ...client.PatchOption) map[string]int {
		return kustomizeApply(t, cl, dir, opts...)
	}
	if k := apply("../../config/dns"); k["Namespace"] != 1 || k["Deployment"] != 1 || k["Service"] != 1 || k["ClusterRole"] != 1 || k["PodDisruptionBudget"] != 1 {
		t.Errorf("config/dns is missing pieces: %v", k)
	}
	if k := apply("../../config/default", client.DryRunAll); k["CustomResourceDefinition"] != 3 || k["ClusterRole"] != 4 || k["ClusterRole/clustermap-mcs"] != 1 ||
		k["ClusterRole/clustermap-edit"] != 1 || k["ClusterRole/clustermap-view"] != 1 || k["ClusterRole/clustermap-metrics-reader"] != 1 ||
		k["Deployment"] != 1 || k["PodDisruptionBudget"] != 1 || k["ConfigMap"] != 2 || k["ValidatingAdmissionPolicy"] != 1 {
		t.Errorf("config/default (MCS) is missing pieces: %v", k)
	}
	// Each mode's, namespace creation's, and the two aggregated into
	// edit/admin and view.
	if k := apply("../../config/examples/all-modes", client.DryRunAll); k["ClusterRole"] != 7 || k["ClusterRoleBinding"] != 4 || k["ClusterRole/clustermap-syndicate-create-namespaces"] != 1 {
		t.Errorf("every mode should bring its ClusterRole and binding: %v", k)
	}
	if k := apply("../../config/examples/cloudmap-dns-only", client.DryRunAll); k["ClusterRole"] != 4 || k["ClusterRole/clustermap-cloudmap-dns"] != 1 || k["ClusterRole/clustermap-mcs"] != 0 {
		t.Errorf("Cloud Map DNS only should bring its ClusterRole only (and the aggregated two): %v", k)
	}
	apply("../../config/samples", client.DryRunAll)
}

// kustomizeApply builds dir as `kubectl apply -k` would and applies every
// object (server-side, with opts); it returns the count of each kind.
func kustomizeApply(t *testing.T, cl client.Client, dir string, opts ...client.PatchOption) map[string]int {
	t.Helper()
	ctx := context.Background()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	kinds := map[string]int{}
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		kinds[u.GetKind()]++
		if u.GetKind() == "ClusterRole" {
			kinds["ClusterRole/"+u.GetName()]++
		}
		if err := cl.Patch(ctx, u, client.Apply, append(opts, client.FieldOwner("kustomize-test"), client.ForceOwnership)...); err != nil {
			t.Errorf("%s: %s %s: %v", dir, u.GetKind(), u.GetName(), err)
		}
	}
	t.Logf("%s: %v", dir, kinds)
	return kinds
}

// The kustomize bases hold the controller's ServiceAccount to what
// clustermap makes, as the chart does: installed for real from the Cloud
// Map DNS only example, then with replication's key set as its component
// sets it. The ServiceAccount is impersonated: its RBAC lets it write every
// Service and EndpointSlice, the policy only clustermap's.
func TestKustomizeAdmissionPolicy(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	admin := env.Clusters[0].Config
	cl := harness.Client(t, admin)
	ctx := context.Background()
	harness.Must(t, cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clustermap-system"}}))
	if k := kustomizeApply(t, cl, "../../config/examples/cloudmap-dns-only"); k["ValidatingAdmissionPolicy"] != 1 || k["ValidatingAdmissionPolicyBinding"] != 1 {
		t.Fatalf("the base lacks its admission policy: %v", k)
	}
	// RBAC out of the way: what is refused below, the policy refuses.
	harness.Must(t, cl.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "controller-is-admin"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "clustermap-system", Name: "clustermap-controller"}}}))
	sa := rest.CopyConfig(admin)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:clustermap-system:clustermap-controller"}
	as, own := kubernetes.NewForConfigOrDie(sa), kubernetes.NewForConfigOrDie(admin)
	ns := "default"
	user := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "user"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "user"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	_, err := own.CoreV1().Services(ns).Create(ctx, user, metav1.CreateOptions{})
	harness.Must(t, err)
	slice := func(name, manager string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: "no-such-service", discoveryv1.LabelManagedBy: manager}}, AddressType: discoveryv1.AddressTypeIPv4}
	}
	_, err = own.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("user-abcde", "endpointslice-controller.k8s.io"), metav1.CreateOptions{})
	harness.Must(t, err)
	refused := func(what string, err error) { t.Helper(); refusedBy(t, "clustermap-writes", what, err) }

	// Enforced once the API server has read the policy, its binding and
	// its ConfigMap.
	harness.Eventually(t, 30*time.Second, "the base's admission policy enforced", func() error {
		cur, err := own.CoreV1().Services(ns).Get(ctx, "user", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Ports[0].Port++
		if _, err := as.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "clustermap-writes") {
			return fmt.Errorf("the controller's ServiceAccount changed a user's Service's spec: %v", err)
		}
		return nil
	})
	// Cloud Map DNS mode: a user's Service's annotations, not its spec.
	cur, err := own.CoreV1().Services(ns).Get(ctx, "user", metav1.GetOptions{})
	harness.Must(t, err)
	metav1.SetMetaDataAnnotation(&cur.ObjectMeta, "cloudmap.clustermap.io/registered-as", "web.example")
	_, err = as.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{})
	harness.Must(t, err)
	_, err = as.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "stray"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	refused("creating a Service that is not derived", err)
	_, err = as.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "derived", Labels: map[string]string{imports.LabelDerivedFor: "web"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	harness.Must(t, err)
	refused("deleting a user's Service", as.CoreV1().Services(ns).Delete(ctx, "user", metav1.DeleteOptions{}))
	_, err = as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("foreign", "someone-else"), metav1.CreateOptions{})
	refused("creating a slice another manager's", err)
	_, err = as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("ours", "controller.clustermap.io"), metav1.CreateOptions{})
	harness.Must(t, err)
	harness.Must(t, as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "ours", metav1.DeleteOptions{}))
	refused("deleting the EndpointSlice controller's slice without replication", as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "user-abcde", metav1.DeleteOptions{}))

	// Replication's component sets its key: the slices a migrated
	// Service's EndpointSlice controller leaves behind may go.
	harness.Must(t, cl.Patch(ctx, &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "clustermap-system", Name: "clustermap-writes"}, Data: map[string]string{"syndicate": "true"}},
		client.Apply, client.FieldOwner("syndicate-component"), client.ForceOwnership))
	harness.Eventually(t, 30*time.Second, "replication's key read", func() error {
		return as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "user-abcde", metav1.DeleteOptions{})
	})
	cur, err = own.CoreV1().Services(ns).Get(ctx, "user", metav1.GetOptions{})
	harness.Must(t, err)
	cur.Spec.Selector = nil // a migration hands the Service over
	_, err = as.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{})
	harness.Must(t, err)
}
