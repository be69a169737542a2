//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// TestPeerKubeconfig: `clustermap peer-kubeconfig` gives a consuming
// cluster what replication needs in the namespaces named, nothing else,
// with a token that expires when asked and ends on --revoke. (The
// replication tests run with the kubeconfigs it writes: PeerDirs.)
func TestPeerKubeconfig(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	peer := env.Clusters[0]
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(peer.Config)
	harness.Must(t, err)
	for _, ns := range []string{"web", "other"} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		harness.Must(t, err)
	}
	file := filepath.Join(t.TempDir(), peer.ID+".yaml")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), append([]string{"peer-kubeconfig", "--kubeconfig", env.Kubeconfig, "--context", peer.ID, "--for", "cluster-a"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("peer-kubeconfig %v: %v: %s", args, err, stderr.String())
		}
		return stderr.String()
	}
	said := run("--namespaces", "web", "--ttl", "15m", "-o", file)
	if !strings.Contains(said, "expires") {
		t.Errorf("peer-kubeconfig does not say when the token expires: %q", said)
	}
	data, err := os.ReadFile(file)
	harness.Must(t, err)
	raw, err := clientcmd.Load(data)
	harness.Must(t, err)
	auth := raw.AuthInfos[raw.Contexts[raw.CurrentContext].AuthInfo]
	if raw.CurrentContext != peer.ID || auth.Token == "" || auth.TokenFile != "" || len(raw.Clusters[peer.ID].CertificateAuthorityData) == 0 {
		t.Fatalf("the kubeconfig should name %s and carry its token and CA inline: %+v", peer.ID, raw)
	}
	if exp := tokenExpiry(t, auth.Token); exp.Before(time.Now().Add(13*time.Minute)) || exp.After(time.Now().Add(16*time.Minute)) {
		t.Errorf("token expires at %v, want about 15 minutes from now", exp)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	harness.Must(t, err)
	as, err := kubernetes.NewForConfig(cfg)
	harness.Must(t, err)

	// What replication does in the namespace granted, and nothing more.
	review := func(verb, group, resource, ns string, allowed bool) access {
		a := authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: ns}
		if resource == "namespaces" {
			a.Name = ns
		}
		return access{a, allowed}
	}
	checkAccess(t, cfg, []access{
		review("watch", "", "services", "web", true),
		review("create", "", "services", "web", true),
		review("delete", "discovery.k8s.io", "endpointslices", "web", true),
		review("update", "discovery.k8s.io", "endpointslices", "web", true),
		review("delete", "", "endpoints", "web", true),
		review("get", "", "namespaces", "web", true),
		review("list", "", "services", "other", false),
		review("list", "", "services", "", false),
		review("get", "", "secrets", "web", false),
		review("list", "", "pods", "web", false),
		review("create", "", "namespaces", "", false),
		review("get", "", "namespaces", "other", false),
		review("create", "rbac.authorization.k8s.io", "rolebindings", "web", false),
	})
	// Real calls agree with the reviews.
	if _, err := as.CoreV1().Services("web").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing Services in web: %v", err)
	}
	if _, err := as.CoreV1().Secrets("web").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets in web: %v, want forbidden", err)
	}

	if exp, ok := replication.TokenExpiry(data); !ok || !exp.Equal(tokenExpiry(t, auth.Token)) {
		t.Errorf("TokenExpiry (the controller's expiry metric) read %v %v, want the token's %v", exp, ok, tokenExpiry(t, auth.Token))
	}

	// The admission policy: what RBAC allows in web, only on what carries
	// cluster-a's mark.
	checkPeerPolicy(t, admin, as, "web")

	// Granted again for every namespace with namespace creation: the
	// binding in web gives way to a cluster-wide one.
	run("--create-namespaces", "-o", file)
	data, err = os.ReadFile(file)
	harness.Must(t, err)
	cfg, err = clientcmd.RESTConfigFromKubeConfig(data)
	harness.Must(t, err)
	as, err = kubernetes.NewForConfig(cfg)
	harness.Must(t, err)
	checkAccess(t, cfg, []access{ // granted for all namespaces with --create-namespaces
		review("list", "", "services", "other", true),
		review("create", "", "namespaces", "", true),
		review("get", "", "secrets", "web", false),
	})
	if rbs, err := admin.RbacV1().RoleBindings("web").List(ctx, metav1.ListOptions{}); err != nil || len(rbs.Items) != 0 {
		t.Errorf("the binding in web should be gone once access covers every namespace: %v %v", rbs, err)
	}
	// RBAC now allows kube-system; the policy does not.
	marked := peerService("in-system", "cluster-a")
	if _, err := as.CoreV1().Services("kube-system").Create(ctx, marked, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system namespaces") {
		t.Errorf("a peer creating a Service in kube-system: %v, want forbidden by the policy", err)
	}
	if _, err := as.CoreV1().Services("other").Create(ctx, marked, metav1.CreateOptions{}); err != nil {
		t.Errorf("a peer granted every namespace creating its replica in other: %v", err)
	}

	// Revoked: the token no longer authenticates.
	run("--revoke")
	harness.Eventually(t, 30*time.Second, "the revoked token refused", func() error {
		_, err := as.CoreV1().Services("web").List(ctx, metav1.ListOptions{})
		if !apierrors.IsUnauthorized(err) {
			return fmt.Errorf("listing with a revoked token: %v, want unauthorized", err)
		}
		return nil
	})
}

// peerService is a Service a peer's replication would make, marked as
// from cluster (unmarked when empty).
func peerService(name, cluster string) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if cluster != "" {
		svc.Labels = map[string]string{replication.LabelSourceCluster: cluster}
	}
	return svc
}

// checkPeerPolicy holds cluster-a's peer identity (as) in ns to the
// clustermap-peer admission policy: its own marked objects written, every
// other refused with the policy's reason, a migration's mode annotation
// the one change to a Service not its own.
func checkPeerPolicy(t *testing.T, admin, as kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	refused := func(what string, err error) { t.Helper(); refusedBy(t, "clustermap-peer", what, err) }
	// The policy is enforced once the API server has read it.
	harness.Eventually(t, 30*time.Second, "the peer policy enforced", func() error {
		_, err := as.CoreV1().Services(ns).Create(ctx, peerService("stray", ""), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			if err == nil {
				_ = admin.CoreV1().Services(ns).Delete(ctx, "stray", metav1.DeleteOptions{})
			}
			return fmt.Errorf("an unmarked Service created: %v", err)
		}
		return nil
	})
	if _, err := as.CoreV1().Services(ns).Create(ctx, peerService("stray", "cluster-b"), metav1.CreateOptions{}); err == nil || !apierrors.IsForbidden(err) {
		t.Errorf("a Service marked as another cluster's created: %v", err)
	}
	replica, err := as.CoreV1().Services(ns).Create(ctx, peerService("replica", "cluster-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the peer creating its replica: %v", err)
	}
	replica.Spec.Ports[0].Port = 8080
	if _, err := as.CoreV1().Services(ns).Update(ctx, replica, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the peer updating its replica: %v", err)
	}

	// A Service of this cluster's own: only its mode annotation.
	own := peerService("own", "")
	own.Spec.Selector = map[string]string{"app": "own"}
	own, err = admin.CoreV1().Services(ns).Create(ctx, own, metav1.CreateOptions{})
	harness.Must(t, err)
	changed := own.DeepCopy()
	changed.Spec.Selector = nil
	_, err = as.CoreV1().Services(ns).Update(ctx, changed, metav1.UpdateOptions{})
	refused("the peer removing the selector of a Service not its own", err)
	changed = own.DeepCopy()
	changed.Labels = map[string]string{replication.LabelSourceCluster: "cluster-a"}
	_, err = as.CoreV1().Services(ns).Update(ctx, changed, metav1.UpdateOptions{})
	refused("the peer marking a Service not its own as its own", err)
	changed = own.DeepCopy()
	changed.Annotations = map[string]string{replication.AnnotationMode: "receiver"}
	if _, err := as.CoreV1().Services(ns).Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the migration's hand-over (the mode annotation of a Service not its own): %v", err)
	}
	refused("the peer deleting a Service not its own", as.CoreV1().Services(ns).Delete(ctx, "own", metav1.DeleteOptions{}))

	// EndpointSlices: its own mark, before and after.
	slice := func(name, cluster string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: "replica", replication.LabelSourceCluster: cluster}}, AddressType: discoveryv1.AddressTypeIPv4}
	}
	_, err = as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("theirs", "cluster-b"), metav1.CreateOptions{})
	refused("the peer creating a slice marked as another cluster's", err)
	mine, err := as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("mine", "cluster-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the peer creating its slice: %v", err)
	}
	mine.Labels[replication.LabelSourceCluster] = "cluster-b"
	_, err = as.DiscoveryV1().EndpointSlices(ns).Update(ctx, mine, metav1.UpdateOptions{})
	refused("the peer handing its slice to another cluster", err)
	_, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("theirs", "cluster-b"), metav1.CreateOptions{})
	harness.Must(t, err)
	refused("the peer deleting another cluster's slice", as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "theirs", metav1.DeleteOptions{}))
	if err := as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Errorf("the peer deleting its slice: %v", err)
	}
	if err := as.CoreV1().Services(ns).Delete(ctx, "replica", metav1.DeleteOptions{}); err != nil {
		t.Errorf("the peer deleting its replica: %v", err)
	}
}

// refusedBy checks that err is the named admission policy's refusal of
// what was tried.
func refusedBy(t *testing.T, policy, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'") {
		t.Errorf("%s: %v, want forbidden by the %s policy", what, err, policy)
	}
}

// tokenExpiry reads a service account token's exp claim (unverified: the
// API server checks it; the test reads when).
func tokenExpiry(t *testing.T, token string) time.Time {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	harness.Must(t, err)
	var claims struct {
		Exp int64 `json:"exp"`
	}
	harness.Must(t, json.Unmarshal(payload, &claims))
	return time.Unix(claims.Exp, 0)
}
