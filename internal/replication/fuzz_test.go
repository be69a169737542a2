package replication

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// Peer kubeconfig files are untrusted input: whatever they hold, reading
// one never panics, and one that would run a command is always refused
// unless allowed, and one accepted reads no local file and talks only to a
// verified TLS server, directly.
func FuzzPeerConfig(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://10.0.0.1:6443\"}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"))
	f.Add([]byte("apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}\n"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, kubeconfig []byte) {
		cfg, err := peerConfig(kubeconfig, false, false)
		raw, lerr := clientcmd.Load(kubeconfig)
		if lerr != nil {
			return
		}
		for _, a := range raw.AuthInfos {
			if a != nil && (a.Exec != nil || a.AuthProvider != nil) && !errors.Is(err, ErrExecPlugin) {
				t.Fatalf("a kubeconfig running a command was not refused (config %v, err %v)", cfg, err)
			}
		}
		if err == nil && cfg != nil && cfg.ExecProvider != nil {
			t.Fatalf("accepted config runs a command: %v", cfg.ExecProvider)
		}
		if err == nil && cfg != nil && (cfg.Insecure || cfg.BearerTokenFile != "" || cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" ||
			cfg.Proxy != nil || !strings.HasPrefix(cfg.Host, "https://")) {
			t.Fatalf("accepted config is insecure or reads files: %+v", cfg)
		}
	})
}
