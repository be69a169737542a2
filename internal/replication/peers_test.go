package replication

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/scheme"
)

// A peer kubeconfig that would run a command is refused unless allowed:
// the command never runs, and the peer counts as down (its replicas kept).
func TestExecPluginsRefused(t *testing.T) {
	// TLS: client-go applies credentials only to TLS servers.
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok") // enough for /readyz: the probe is where a plugin would run
	}))
	defer api.Close()
	for _, allow := range []bool{false, true} {
		dir, marker := t.TempDir(), filepath.Join(t.TempDir(), "ran")
		kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: p, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: p, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: ["-c", "touch %s; echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'"], interactiveMode: Never}}}]
contexts: [{name: p, context: {cluster: p, user: p}}]
current-context: p
`, api.URL, base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})), marker)
		if err := os.WriteFile(filepath.Join(dir, "peer.yaml"), []byte(kubeconfig), 0o600); err != nil {
			t.Fatal(err)
		}
		var broken []error
		ps := &Peers{Dir: dir, Scheme: scheme.Scheme, Log: testr.New(t), AllowExecPlugins: allow,
			OnBroken: func(peer, _ string, err error) { broken = append(broken, err) }}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = ps.Start(ctx)
		cancel()
		_, err := os.Stat(marker)
		ran := err == nil
		if ran != allow {
			t.Errorf("allowed=%v: the command ran=%v", allow, ran)
		}
		if !ps.Configured("peer") {
			t.Errorf("allowed=%v: the peer should stay configured (down or up), so that its replicas are kept", allow)
		}
		if !allow && len(ps.Down()) != 1 {
			t.Errorf("a refused peer should count as down: %v", ps.Down())
		}
		if refused := len(broken) == 1 && errors.Is(broken[0], ErrExecPlugin); refused == allow || len(broken) > 1 {
			t.Errorf("allowed=%v: told of %v, want one ErrExecPlugin when refused (once per file version), none when allowed", allow, broken)
		}
	}
}

func TestPeerConfigRefusesAuthProviders(t *testing.T) {
	for _, c := range []struct {
		user  string
		allow bool
		ok    bool
	}{
		{`{token: t}`, false, true},
		{`{auth-provider: {name: oidc, config: {idp-issuer-url: "https://x"}}}`, false, false},
		{`{auth-provider: {name: oidc, config: {idp-issuer-url: "https://x"}}}`, true, true},
		{`{exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}}`, false, false},
	} {
		kc := `apiVersion: v1
kind: Config
clusters: [{name: p, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: p, user: ` + c.user + `}]
contexts: [{name: p, context: {cluster: p, user: p}}]
current-context: p
`
		_, err := peerConfig([]byte(kc), c.allow, false)
		if (err == nil) != c.ok {
			t.Errorf("user %s, allow %v: err %v", c.user, c.allow, err)
		}
	}
}

// A peer kubeconfig may not read local files, skip TLS verification, talk
// plain HTTP or through a proxy (whoever writes the peers directory could
// have the controller's credentials sent anywhere, or its files read),
// unless --allow-insecure-peers says so.
func TestPeerConfigRefusesInsecure(t *testing.T) {
	for _, c := range []struct {
		cluster, user string
		ok            bool
	}{
		{`{server: "https://127.0.0.1:1", certificate-authority-data: ""}`, `{token: t}`, true},
		{`{server: "http://127.0.0.1:1"}`, `{token: t}`, false},
		{`{server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}`, `{token: t}`, false},
		{`{server: "https://127.0.0.1:1", certificate-authority: /etc/ca.crt}`, `{token: t}`, false},
		{`{server: "https://127.0.0.1:1", proxy-url: "http://evil:3128"}`, `{token: t}`, false},
		{`{server: "https://127.0.0.1:1"}`, `{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}`, false},
		{`{server: "https://127.0.0.1:1"}`, `{client-certificate: /etc/c.crt, client-key: /etc/c.key}`, false},
	} {
		kc := `apiVersion: v1
kind: Config
clusters: [{name: p, cluster: ` + c.cluster + `}]
users: [{name: p, user: ` + c.user + `}]
contexts: [{name: p, context: {cluster: p, user: p}}]
current-context: p
`
		_, err := peerConfig([]byte(kc), false, false)
		if (err == nil) != c.ok || !c.ok && !errors.Is(err, ErrInsecurePeer) {
			t.Errorf("cluster %s, user %s: err %v", c.cluster, c.user, err)
		}
		if _, err := peerConfig([]byte(kc), false, true); !c.ok && errors.Is(err, ErrInsecurePeer) {
			t.Errorf("allowed, cluster %s, user %s: still refused: %v", c.cluster, c.user, err)
		}
	}
}

// A peer kubeconfig's token expiry is exported as the peer's gauge (what
// ClustermapSyndicatePeerTokenExpiring reads), and goes with the peer.
func TestPeerTokenExpiryIsExported(t *testing.T) {
	dir := t.TempDir()
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"exp":2000000000}`))
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: p, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: p, user: {token: "e30.%s.c2ln"}}]
contexts: [{name: p, context: {cluster: p, user: p}}]
current-context: p
`, payload)
	path := filepath.Join(dir, "expiring.yaml")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	ps := &Peers{Dir: dir, Scheme: scheme.Scheme, Log: testr.New(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = ps.Start(ctx)
	cancel()
	if got := testutil.ToFloat64(peerTokenExpiry.WithLabelValues("expiring")); got != 2000000000 {
		t.Errorf("the expiry gauge reads %v, want the token's exp 2000000000", got)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	ps.scan(context.Background())
	if n := testutil.CollectAndCount(peerTokenExpiry); n != 0 {
		t.Errorf("%d expiry series left after the peer's file went", n)
	}
}
