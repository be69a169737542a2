//go:build linux

package devenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BinDir finds the pinned tools: $CLUSTERMAP_BIN_DIR, else ./bin of the
// checkout holding the working directory.
func BinDir() string {
	if d := os.Getenv("CLUSTERMAP_BIN_DIR"); d != "" {
		return d
	}
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "go.mod")); err == nil {
			return filepath.Join(dir, "bin")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "bin"
		}
		dir = parent
	}
}

// ForTest starts n clusters for a test and stops them, processes and files,
// when the test ends, whether it passed or not.
func ForTest(t testing.TB, n int) *Env {
	t.Helper()
	return ForTestWith(t, Options{Clusters: n})
}

// ForTestWith starts clusters as opts say (its directories, tools and
// prefix are the test's own).
func ForTestWith(t testing.TB, opts Options) *Env {
	t.Helper()
	// A short directory of its own: kwokctl keeps sockets and pid files there.
	dir, err := os.MkdirTemp("", "cm-")
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts.BinDir, opts.StateDir, opts.Prefix, opts.Log = BinDir(), dir, "t"+hex.EncodeToString(suffix), testLog{t}
	env, err := Up(ctx, opts)
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
