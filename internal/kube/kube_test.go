package kube

import (
	"os"
	"path/filepath"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestNamespaceFilter(t *testing.T) {
	all := NamespaceFilter(nil, DefaultExcludeNamespaces)
	only := NamespaceFilter([]string{"a", "kube-system"}, DefaultExcludeNamespaces)
	for ns, want := range map[string][2]bool{
		"default": {true, false}, "a": {true, true}, "kube-system": {false, false}, "": {true, true},
	} {
		if all(ns) != want[0] || only(ns) != want[1] {
			t.Errorf("%q: all %v only %v, want %v", ns, all(ns), only(ns), want)
		}
	}
}

// A controller reached through a kubeconfig (run outside the cluster, as
// the dev fleet and the fault campaign run it) has no client-side request
// limit, as in a cluster; client-go's default would allow 5 a second.
func TestKubeconfigHasNoClientSideLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: one
  context: {cluster: c, user: u}
current-context: one
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(path, "one")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS >= 0 || cfg.RateLimiter != nil {
		t.Errorf("QPS %v, rate limiter %v: want none (QPS < 0), as in a cluster", cfg.QPS, cfg.RateLimiter)
	}
}

// An endpoint is ready unless it says it is not.
func TestEndpointReady(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		ready *bool
		want  bool
	}{{nil, true}, {&yes, true}, {&no, false}} {
		if got := EndpointReady(discoveryv1.EndpointConditions{Ready: tc.ready}); got != tc.want {
			t.Errorf("Ready %v: %v, want %v", tc.ready, got, tc.want)
		}
	}
}
