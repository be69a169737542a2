//go:build linux && e2e

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// dev up writes a kubeconfig with a context per cluster id, through which
// each cluster shows its ClusterProperties; dev down removes it all.
func TestDevUpDown(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dev")
	kubeconfig := filepath.Join(t.TempDir(), "kc.yaml")
	t.Cleanup(func() { _, _ = run(t, "down", "--state-dir", state) })

	out, err := run(t, "up", "--clusters", "2", "--state-dir", state, "--kubeconfig", kubeconfig, "--port-base", "0")
	if err != nil {
		t.Fatalf("dev up: %v\n%s", err, out)
	}
	if !strings.Contains(out, "KUBECONFIG="+kubeconfig+"\n") {
		t.Errorf("dev up did not print KUBECONFIG=%s:\n%s", kubeconfig, out)
	}
	// As `kubectl --context cluster-2 get clusterproperties` would.
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: "cluster-2"}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cl := harness.ClientWith(t, cfg, devenv.Scheme)
	props := &aboutv1alpha1.ClusterPropertyList{}
	if err := cl.List(context.Background(), props); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range props.Items {
		got[p.Name] = p.Spec.Value
	}
	if got[aboutv1alpha1.ClusterIDProperty] != "cluster-2" || got[aboutv1alpha1.ClusterSetProperty] != "clusterset-dev" || len(got) != 2 {
		t.Errorf("cluster-2's ClusterProperties: %v", got)
	}

	if out, err := run(t, "down", "--state-dir", state); err != nil {
		t.Fatalf("dev down: %v\n%s", err, out)
	}
	for _, p := range []string{state, kubeconfig} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after dev down", p)
		}
	}
}

func TestDevUpRejectsZeroClusters(t *testing.T) {
	state := filepath.Join(t.TempDir(), "dev")
	_, err := run(t, "up", "--clusters", "0", "--state-dir", state)
	if err == nil || !strings.Contains(err.Error(), "--clusters must be between 1 and") {
		t.Fatalf("dev up --clusters 0: %v", err)
	}
}
