//go:build e2e

package soak

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// partition relays TCP from the members to the hub's API server. Cut, it
// is a network partition: nothing passes either way, open connections
// hang, new ones are accepted and hang, and what was sent meanwhile is
// delivered once healed, as TCP retransmits it. The hub's own components
// do not pass through it.
type partition struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	healed chan struct{} // nil while whole, closed when a cut heals
	held   atomic.Int64  // connections and reads that met a cut
}

// relayTo starts a partition in front of target (host:port) until the
// test ends.
func relayTo(t *testing.T, target string) *partition {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, target: target}
	t.Cleanup(func() { p.heal(); ln.Close() })
	go p.serve()
	return p
}

// URL is what the members' kubeconfigs name as the hub.
func (p *partition) URL() string { return "https://" + p.ln.Addr().String() }

func (p *partition) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.healed == nil {
		p.healed = make(chan struct{})
	}
}

func (p *partition) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.healed != nil {
		close(p.healed)
		p.healed = nil
	}
}

// pass waits while the partition is cut, counting what it held.
func (p *partition) pass() {
	p.mu.Lock()
	healed := p.healed
	p.mu.Unlock()
	if healed != nil {
		p.held.Add(1)
		<-healed
	}
}

func (p *partition) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			p.pass()
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				return // the hub is down: the member sees the connection end
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { p.copy(out, in); done <- struct{}{} }()
			go func() { p.copy(in, out); done <- struct{}{} }()
			<-done // one side ended: both go
		}()
	}
}

// copy relays one direction, holding each read while the partition is cut.
func (p *partition) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.pass()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
