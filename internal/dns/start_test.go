package dns

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A listener that stops under the server (closed, say) is an error the
// server reports on Err and on Healthy, which the liveness probe reads;
// closing the server is none.
func TestServeErrorsFailHealth(t *testing.T) {
	pc, l, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := NewHandler(5, nil)
	s := &Server{Addr: pc.LocalAddr().String(), cancel: cancel, errc: make(chan error, 1),
		udp: &dns.Server{PacketConn: pc, Handler: h}, tcp: &dns.Server{Listener: l, Handler: h}}
	s.serve(ctx)
	if err := s.Healthy(); err != nil {
		t.Fatalf("healthy while serving: %v", err)
	}
	_ = l.Close()
	select {
	case err := <-s.Err():
		if !strings.Contains(err.Error(), "tcp") || s.Healthy() == nil {
			t.Errorf("Err %v, Healthy %v", err, s.Healthy())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a closed listener was not reported")
	}
	cancel()
	_ = s.udp.Shutdown()
}
