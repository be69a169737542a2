//go:build e2e

package soak

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one supervised process: restarted a second after it exits, as
// a kubelet restarts a container, until stopped.
type proc struct {
	name string
	args []string
	env  []string
	log  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	stopped bool
	done    chan struct{}
	starts  int
}

func supervise(t *testing.T, dir, name string, env []string, args ...string) *proc {
	p := &proc{name: name, args: args, env: env, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	go p.run(t)
	t.Cleanup(p.stop)
	return p
}

func (p *proc) run(t *testing.T) {
	defer close(p.done)
	for {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		out, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			p.mu.Unlock()
			t.Errorf("%s: %v", p.name, err)
			return
		}
		cmd := exec.Command(p.args[0], p.args[1:]...)
		cmd.Env, cmd.Stdout, cmd.Stderr = append(os.Environ(), p.env...), out, out
		if err := cmd.Start(); err != nil {
			p.mu.Unlock()
			out.Close()
			t.Errorf("%s: %v", p.name, err)
			return
		}
		p.cmd = cmd
		p.starts++
		p.mu.Unlock()
		_ = cmd.Wait()
		out.Close()
		time.Sleep(time.Second)
	}
}

// kill sends SIGKILL: no cleanup, no lease release, as a node loss does.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// pause stops the process gracefully (SIGTERM) and keeps it down until
// resume.
func (p *proc) pause() {
	p.mu.Lock()
	p.stopped = true
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	<-p.done
}

func (p *proc) resume(t *testing.T) {
	p.mu.Lock()
	p.stopped, p.done = false, make(chan struct{})
	p.mu.Unlock()
	go p.run(t)
}

func (p *proc) stop() {
	p.mu.Lock()
	already := p.stopped
	p.mu.Unlock()
	if !already {
		p.pause()
	}
}

func (p *proc) tail(n int) string {
	data, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
