//go:build e2e

package soak

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clustermap/clustermap/internal/devenv/supervise"
)

// startProc runs a process of the fleet, restarted a second after it
// exits, logging to dir/name.log, until the test ends. Stop is a graceful
// stop (SIGTERM, as long as it takes), Kill a kill -9.
func startProc(t *testing.T, dir, name string, env []string, args ...string) *supervise.Process {
	p := &supervise.Process{Name: name, Argv: args, Env: env, Log: filepath.Join(dir, name+".log")}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// tail is the last n lines of a process's log.
func tail(p *supervise.Process, n int) string {
	data, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
