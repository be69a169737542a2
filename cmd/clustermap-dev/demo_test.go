//go:build linux && e2e

package main

import (
	"bufio"
	"context"
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
// answer of its cross-cluster request, runs every command it printed as
// printed (a shell, bin first on PATH, the KUBECONFIG it exported), kills
// it with SIGKILL (nothing of it cleans up), and checks that `dev down`
// leaves no namespace, link, file or process of it behind.
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
	printed := make(chan []string, 1) // every line, once the demo is up
	var ended atomic.Bool             // no logging once the test has ended
	defer ended.Store(true)
	go func() {
		sc := bufio.NewScanner(out)
		var lines []string
		for sc.Scan() {
			if !ended.Load() {
				t.Log(sc.Text())
			}
			lines = append(lines, sc.Text())
			if strings.HasPrefix(sc.Text(), "The demo runs until interrupted") {
				printed <- lines
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

	select {
	case lines := <-printed:
		runPrinted(t, bin, lines)
	case <-time.After(time.Minute):
		_ = demo.Process.Kill()
		t.Fatal("the demo did not say it was up within a minute of its request")
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

// printedCommands are the commands the demo showed its user: the indented
// lines that start with kubectl, dig, nslookup or the AWS CLI's variables,
// and the "$ " lines it showed with their output; env is what the
// "export" lines set.
func printedCommands(lines []string) (env, cmds []string) {
	for _, l := range lines {
		cmd, shown := strings.CutPrefix(l, "$ ")
		if !shown {
			var indented bool
			if cmd, indented = strings.CutPrefix(l, "  "); !indented {
				continue
			}
		}
		if v, ok := strings.CutPrefix(cmd, "export "); ok {
			env = append(env, v)
			continue
		}
		for _, p := range []string{"kubectl ", "dig ", "nslookup ", "AWS_"} {
			if strings.HasPrefix(cmd, p) {
				cmds = append(cmds, cmd)
			}
		}
	}
	return env, cmds
}

// runPrinted runs every printed command in a shell and checks it worked:
// exit 0 and some output; the requests and lookups show cluster-1's pods
// or the import.
func runPrinted(t *testing.T, bin string, lines []string) {
	t.Helper()
	env, cmds := printedCommands(lines)
	if len(env) != 1 || len(cmds) < 10 {
		t.Fatalf("the demo printed exports %v and %d commands: %q", env, len(cmds), cmds)
	}
	for _, c := range cmds {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sh := exec.CommandContext(ctx, "bash", "-c", c)
		sh.Env = append(os.Environ(), append(env, "PATH="+bin+":"+os.Getenv("PATH"))...)
		out, err := sh.CombinedOutput()
		cancel()
		switch {
		case err != nil:
			t.Errorf("printed command failed: %s\n%v\n%s", c, err, out)
		case len(strings.TrimSpace(string(out))) == 0:
			t.Errorf("printed command said nothing: %s", c)
		case strings.Contains(c, "curl"):
			if a := dataplane.ParseAnswer(string(out)); a["cluster"] != "cluster-1" {
				t.Errorf("%s answered %q, want a pod of cluster-1", c, out)
			}
		case strings.Contains(c, "discover-instances"):
			if !strings.Contains(string(out), `"InstanceId"`) {
				t.Errorf("%s found no instance:\n%s", c, out)
			}
		case strings.Contains(c, "dig") || strings.Contains(c, "nslookup"):
			if !strings.Contains(string(out), "10.") {
				t.Errorf("%s gave no address:\n%s", c, out)
			}
		}
		t.Logf("ran %s", c)
	}
}
