//go:build linux

// Package supervise keeps a process running, started again a second after
// it exits (as a kubelet restarts a container) until stopped. The lab's
// node agent runs kube-proxy, DNS and pod servers with it; the fault
// campaign runs controllers and the emulator with it, and kills, stops and
// starts them.
package supervise

import (
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is one supervised command.
type Process struct {
	Name string
	Argv []string
	// Env is added to this process's environment, or is all of it with
	// OwnEnv (a pod's container gets its own, not the agent's).
	Env    []string
	OwnEnv bool
	// Dir is the working directory; empty is the supervisor's.
	Dir string
	// Log, when set, gets the output appended.
	Log string
	// Grace is how long Stop waits after SIGTERM before SIGKILL; zero waits
	// as long as the process takes.
	Grace time.Duration
	// OnStart, when set, hears each start with the process id.
	OnStart func(pid int)
	// OnExit, when set, hears each exit that Stop did not cause.
	OnExit func(error)
	// Again, when set, decides after each such exit whether to start the
	// process again (a pod's restartPolicy); unset, it always is.
	Again func(error) bool

	mu     sync.Mutex
	cmd    *exec.Cmd
	stop   chan struct{} // closed by Stop
	done   chan struct{} // closed once the loop has returned
	starts int
}

// Start runs the process, and again each time it exits, until Stop. A
// process already running is left as it is.
func (p *Process) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil && !closed(p.stop) {
		return
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go p.loop(p.stop, p.done)
}

// Stop ends the process (SIGTERM, then SIGKILL after Grace) and keeps it
// down until Start; it returns once the process has exited.
func (p *Process) Stop() {
	p.mu.Lock()
	stop, done := p.stop, p.done
	if stop != nil && !closed(stop) {
		close(stop)
	}
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Kill sends SIGKILL to the running process: no cleanup and no goodbye, as
// when a node is lost. It is started again a second later.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// Starts counts the times the process was started.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

func (p *Process) loop(stop, done chan struct{}) {
	defer close(done)
	for {
		err := p.run(stop)
		if closed(stop) {
			return
		}
		if p.OnExit != nil {
			p.OnExit(err)
		}
		if p.Again != nil && !p.Again(err) {
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// run starts the process once and waits for it to exit, or for stop.
func (p *Process) run(stop chan struct{}) error {
	var out io.Writer = io.Discard
	if p.Log != "" {
		if f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			defer f.Close()
			out = f
		}
	}
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Env = append(os.Environ(), p.Env...)
	if p.OwnEnv {
		cmd.Env = p.Env
	}
	cmd.Dir = p.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// The child dies with its supervisor: a killed agent or test leaves
	// nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.mu.Lock()
	if closed(stop) {
		p.mu.Unlock()
		return nil
	}
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return err
	}
	p.cmd = cmd
	p.starts++
	p.mu.Unlock()
	if p.OnStart != nil {
		p.OnStart(cmd.Process.Pid)
	}

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-stop:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	var kill <-chan time.Time
	if p.Grace > 0 {
		kill = time.After(p.Grace)
	}
	select {
	case err := <-exited:
		return err
	case <-kill:
		_ = cmd.Process.Kill()
		return <-exited
	}
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
