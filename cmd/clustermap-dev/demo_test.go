//go:build linux && e2e

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
)

// TestDemoRequestThenKillThenDown runs the demo as a user does, reads the
// answer of its cross-cluster request, kills it with SIGKILL (nothing of
// it cleans up), and checks that `dev down` leaves no namespace, link,
// file or process of it behind.
func TestDemoRequestThenKillThenDown(t *testing.T) {
	// Short: kwokctl keeps sockets under the state directory.
	state, err := os.MkdirTemp("", "cm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	bin := devenv.BinDir()
	demo := exec.Command(filepath.Join(bin, "clustermap-dev"), "demo", "--state-dir", state, "--bin-dir", bin,
		"--port-base", "0", "--cloudmap-listen", "127.0.0.1:0")
	out, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	demo.Stderr = demo.Stdout
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = run(t, "down", "--state-dir", state) })

	answer := make(chan string, 1)
	var ended atomic.Bool // no logging once the test has ended
	defer ended.Store(true)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if !ended.Load() {
				t.Log(sc.Text())
			}
			if a := dataplane.ParseAnswer(sc.Text()); a["cluster"] != "" {
				select {
				case answer <- sc.Text():
				default:
				}
			}
		}
	}()
	select {
	case a := <-answer:
		if got := dataplane.ParseAnswer(a); got["cluster"] != "cluster-1" || !strings.HasPrefix(got["pod"], "nginx-") {
			t.Errorf("the demo's request from cluster-2 was answered by %q, want an nginx pod of cluster-1", a)
		}
	case <-time.After(4 * time.Minute):
		_ = demo.Process.Kill()
		t.Fatal("the demo printed no answer to its request within 4 minutes")
	}

	// What runs now: the clusters' components, kube-proxy, DNS and pod
	// servers in the data plane's namespaces.
	tag := dataplane.TagOf(state)
	var pids []int
	for _, ns := range dataplane.Namespaces(dataplane.Fabric{Tag: tag}.Prefix()) {
		o, _ := exec.Command(dataplane.IPPath(), "netns", "pids", ns).Output()
		for _, p := range strings.Fields(string(o)) {
			if pid, err := strconv.Atoi(p); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) == 0 {
		t.Fatal("no process runs in the data plane's namespaces")
	}
	_ = demo.Process.Signal(syscall.SIGKILL)
	_ = demo.Wait()

	if o, err := run(t, "down", "--state-dir", state); err != nil {
		t.Fatalf("dev down after kill -9: %v\n%s", err, o)
	}
	if left := dataplane.Leftovers(tag); len(left) > 0 {
		t.Errorf("dev down left %v", left)
	}
	for _, pid := range pids {
		if devenv.Alive(pid) {
			t.Errorf("process %d of the data plane still runs", pid)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "state.json")); !os.IsNotExist(err) {
		t.Errorf("the state directory is left: %v", err)
	}
}
