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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/clustermap/clustermap/internal/devenv"
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
