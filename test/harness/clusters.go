//go:build linux

// Package harness is what tests that start clusters, emulators and
// processes share: e2e, soak and bench run on it.
package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/kube"
)

// Clusters starts n clusters for a test and stops them, processes and files,
// when the test ends, whether it passed or not.
func Clusters(t testing.TB, n int) *devenv.Env {
	t.Helper()
	return ClustersWith(t, devenv.Options{Clusters: n})
}

// ClustersWith starts clusters as opts say (its directories, tools and
// prefix are the test's own).
func ClustersWith(t testing.TB, opts devenv.Options) *devenv.Env {
	t.Helper()
	// A short directory of its own: kwokctl keeps sockets and pid files there.
	dir, err := os.MkdirTemp("", "cm-")
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	// Starts are serialized machine-wide, so a test waits behind every
	// other test's (and process's) starts: 5 minutes ran out for 4
	// clusters beside two suites on 2 cores. More clusters, more time.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+time.Duration(opts.Clusters)*2*time.Minute)
	defer cancel()
	opts.BinDir, opts.StateDir, opts.Prefix, opts.Log = devenv.BinDir(), dir, "t"+hex.EncodeToString(suffix), testLog{t}
	env, err := devenv.Up(ctx, opts)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting %d local clusters: %v", opts.Clusters, err)
	}
	t.Cleanup(func() {
		if err := env.Down(context.Background()); err != nil {
			t.Errorf("stopping local clusters: %v", err)
		}
	})
	return env
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// CloudMap serves an emulator in this process for the length of a test.
func CloudMap(t testing.TB, opts cloudmaplocal.Options) *devenv.CloudMap {
	t.Helper()
	cm, err := devenv.StartCloudMap(opts, "127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cm.Close() })
	return cm
}

// Client is a client of the cluster cfg reaches, knowing every kind
// clustermap reads and writes (kube.Scheme).
func Client(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	return ClientWith(t, cfg, kube.Scheme())
}

// ClientWith is a client of the cluster cfg reaches that knows the kinds
// of scheme (nil: client-go's).
func ClientWith(t testing.TB, cfg *rest.Config, scheme *runtime.Scheme) client.Client {
	t.Helper()
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
