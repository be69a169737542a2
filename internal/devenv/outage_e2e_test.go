//go:build linux && e2e

package devenv_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// A cluster created while another is stopped, as another test process
// does, must not take the stopped one's ports: the stopped cluster comes
// back on its own address, with its own data.
func TestStoppedClusterKeepsItsPorts(t *testing.T) {
	// Three cluster starts, each waiting its turn behind every other test
	// process's (starts are serialized machine-wide): 3 minutes ran out
	// with two suites on 2 cores. The test judges addresses, not speed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	up := func(prefix string) *devenv.Env {
		env, err := devenv.Up(ctx, devenv.Options{Clusters: 1, BinDir: devenv.BinDir(), Prefix: prefix,
			StateDir: filepath.Join(t.TempDir(), "state"), Log: os.Stderr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Down(context.Background()) })
		return env
	}
	a := up("t-held-a")
	ca := a.Clusters[0]
	c := harness.ClientWith(t, ca.Config, nil)
	mark := &corev1.Namespace{}
	mark.Name = "made-before-the-outage"
	if err := c.Create(ctx, mark); err != nil {
		t.Fatal(err)
	}
	if err := a.StopCluster(ctx, ca); err != nil {
		t.Fatal(err)
	}
	b := up("t-held-b")
	if b.Clusters[0].Server == ca.Server {
		t.Fatalf("a cluster made during the outage took the stopped cluster's address %s", ca.Server)
	}
	if err := a.StartCluster(ctx, ca); err != nil {
		t.Fatal(err)
	}
	// The stopped cluster's own credentials and data: another apiserver
	// on its port would fail the TLS handshake or lack the namespace.
	if err := c.Get(ctx, client.ObjectKeyFromObject(mark), mark); err != nil {
		t.Fatalf("%s after the restart: %v", ca.Server, err)
	}
}
