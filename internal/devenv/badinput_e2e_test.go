//go:build linux && e2e

package devenv_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/devenv"
)

func TestUpRejectsBadInputBeforeStartingAnything(t *testing.T) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port

	cases := map[string]struct {
		opts devenv.Options
		want []string
	}{
		"no clusters":  {devenv.Options{Clusters: 0, BinDir: devenv.BinDir()}, []string{"--clusters must be between 1 and"}},
		"missing tool": {devenv.Options{Clusters: 1, BinDir: t.TempDir()}, []string{"kwokctl is missing", "make tools"}},
		// cluster-1 would listen on busy.
		"port in use": {devenv.Options{Clusters: 2, BinDir: devenv.BinDir(), PortBase: busy - 1}, []string{"port " + strconv.Itoa(busy) + " for cluster-1 is in use", "--port-base"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.opts.StateDir = filepath.Join(t.TempDir(), "state")
			_, err := devenv.Up(context.Background(), tc.opts)
			if err == nil {
				t.Fatal("Up succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if _, err := os.Stat(tc.opts.StateDir); !os.IsNotExist(err) {
				t.Errorf("state directory left behind: %v", err)
			}
		})
	}
}

// A cluster that cannot start takes its already started siblings down with
// it: nothing keeps running, no file stays.
func TestUpFailureLeavesNothingRunning(t *testing.T) {
	bin := t.TempDir()
	real := devenv.BinDir()
	for _, b := range devenv.Binaries {
		if err := os.Symlink(filepath.Join(real, b), filepath.Join(bin, b)); err != nil {
			t.Fatal(err)
		}
	}
	// The second cluster's apiserver refuses to start.
	stateDir := filepath.Join(t.TempDir(), "state")
	apiserver := filepath.Join(bin, "kube-apiserver")
	os.Remove(apiserver)
	script := "#!/bin/sh\ncase \"$*\" in *t-fail-cluster-2*) echo broken apiserver >&2; exit 1;; esac\nexec " + filepath.Join(real, "kube-apiserver") + " \"$@\"\n"
	if err := os.WriteFile(apiserver, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// Starts wait their turn behind every other test process's (they are
	// serialized machine-wide): a bound that ran out first would fail Up
	// without naming cluster-2. The test judges the failure, not speed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := devenv.Up(ctx, devenv.Options{Clusters: 2, BinDir: bin, StateDir: stateDir, Prefix: "t-fail", Log: os.Stderr})
	if err == nil {
		t.Fatal("Up succeeded with a broken apiserver")
	}
	if !strings.Contains(err.Error(), "cluster-2") {
		t.Errorf("error does not name the failing cluster: %v", err)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state directory left behind: %v", err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, _ := os.ReadFile(p)
		if strings.Contains(string(data), stateDir) {
			t.Errorf("process %s still runs: %s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(data), "\x00", " "))
		}
	}
}
