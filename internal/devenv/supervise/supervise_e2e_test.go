//go:build e2e && linux

package supervise_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/devenv/supervise"
	"github.com/clustermap/clustermap/test/harness"
)

// eventually polls often: the processes here live for a fraction of a second.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	harness.EventuallyEvery(t, 20*time.Millisecond, 10*time.Second, what, func() error {
		if !ok() {
			return errors.New("not yet")
		}
		return nil
	})
}

// A process that exits is started again; Kill restarts it; Stop keeps it
// down (SIGKILL after Grace when it ignores SIGTERM) until Start.
func TestRestartKillStopStart(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "out.log")
	exits := make(chan error, 10)
	p := &supervise.Process{Name: "sh", Argv: []string{"sh", "-c", `echo "started $GREETING"; exec sleep 0.2`}, Env: []string{"GREETING=hi"},
		Log: log, OnExit: func(err error) { exits <- err }}
	p.Start()
	eventually(t, "started again after it exited", func() bool { return p.Starts() >= 2 })
	if err := <-exits; err != nil {
		t.Errorf("a clean exit reported %v", err)
	}
	p.Stop()
	n := p.Starts()
	time.Sleep(1500 * time.Millisecond)
	if p.Starts() != n {
		t.Errorf("started %d times after Stop", p.Starts()-n)
	}
	data, _ := os.ReadFile(log)
	if !strings.Contains(string(data), "started hi") {
		t.Errorf("log %q lacks the process's output with its environment", data)
	}

	// Ignores SIGTERM: Stop kills it after Grace; Kill while running restarts it.
	// It says "ready" once its trap is set: a SIGTERM before that would end
	// it at once.
	qlog := filepath.Join(dir, "stubborn.log")
	ready := func(n int) func() bool {
		return func() bool {
			data, _ := os.ReadFile(qlog)
			return strings.Count(string(data), "ready") == n
		}
	}
	q := &supervise.Process{Name: "stubborn", Argv: []string{"sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`},
		Log: qlog, Grace: 300 * time.Millisecond}
	q.Start()
	eventually(t, "started", func() bool { return q.Starts() == 1 })
	// Killed before it says "ready", the first run would never say it.
	eventually(t, "the first run said ready", ready(1))
	q.Kill()
	eventually(t, "started again after Kill", func() bool { return q.Starts() == 2 })
	eventually(t, "SIGTERM ignored by the second run", ready(2))
	start := time.Now()
	q.Stop()
	if took := time.Since(start); took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("Stop of a process ignoring SIGTERM took %v, want Grace (300ms) then SIGKILL", took)
	}
	q.Start()
	eventually(t, "started again by Start", func() bool { return q.Starts() == 3 })
	q.Stop()
}

// Again decides after each exit: a container's restartPolicy. The process
// runs with its own environment and working directory, and OnStart hears
// each start.
func TestAgainOwnEnvDir(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "out.log")
	var exits []error
	var pids []int
	p := &supervise.Process{Name: "twice", Argv: []string{"/bin/sh", "-c", `echo "$PWD ${HOME:-nohome} $ONLY"; exit 3`},
		Env: []string{"ONLY=mine"}, OwnEnv: true, Dir: dir, Log: log,
		OnStart: func(pid int) { pids = append(pids, pid) },
		OnExit:  func(err error) { exits = append(exits, err) },
		Again:   func(error) bool { return len(exits) < 2 }}
	p.Start()
	eventually(t, "two runs, then down", func() bool { return p.Starts() == 2 })
	time.Sleep(1500 * time.Millisecond) // a third start would come a second after the exit
	p.Stop()
	if p.Starts() != 2 || len(pids) != 2 || len(exits) != 2 {
		t.Fatalf("starts %d, pids %v, exits %v: want two of each", p.Starts(), pids, exits)
	}
	if want := dir + " nohome mine\n"; func() string { b, _ := os.ReadFile(log); return string(b) }() != want+want {
		t.Errorf("log %q, want the working directory and only its own environment, twice", want)
	}
}
