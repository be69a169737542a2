package dns

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// Server is a running clusterset DNS server.
type Server struct {
	// Addr is where it answers, over UDP and TCP.
	Addr   string
	source *source
	udp    *dns.Server
	tcp    *dns.Server
	cancel context.CancelFunc
	errc   chan error
	// failed is the first error that stopped serving.
	failed atomic.Pointer[error]
}

// Start serves the zone on listen (UDP and TCP), fed from the cluster cfg
// reaches; metrics go to reg (nil: none).
func Start(ctx context.Context, cfg *rest.Config, listen, zone string, ttl uint32, reg prometheus.Registerer) (*Server, error) {
	h := NewHandler(ttl, reg)
	pc, l, err := listenBoth(listen)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Server{
		Addr: pc.LocalAddr().String(), source: &source{Zone: zone, Handler: h}, cancel: cancel, errc: make(chan error, 1),
		udp: &dns.Server{PacketConn: pc, Handler: h}, tcp: &dns.Server{Listener: l, Handler: h},
	}
	s.source.synced = make(chan struct{})
	go func() {
		if err := s.source.Run(ctx, cfg); err != nil {
			s.fail(err)
		}
	}()
	s.serve(ctx)
	return s, nil
}

// serve answers over UDP and TCP until ctx ends; what stops either before
// is the server's failure.
func (s *Server) serve(ctx context.Context) {
	for proto, srv := range map[string]*dns.Server{"udp": s.udp, "tcp": s.tcp} {
		go func() {
			if err := srv.ActivateAndServe(); err != nil && ctx.Err() == nil {
				s.fail(fmt.Errorf("serving DNS over %s on %s stopped: %w", proto, s.Addr, err))
			}
		}()
	}
}

// fail records what stopped serving (Healthy reports it) and delivers it
// on Err, once.
func (s *Server) fail(err error) {
	if s.failed.CompareAndSwap(nil, &err) {
		select {
		case s.errc <- err:
		default:
		}
	}
}

// Healthy says why the server no longer answers, if it does not (the
// liveness probe).
func (s *Server) Healthy() error {
	if err := s.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// Synced is closed once the first index is served.
func (s *Server) Synced() <-chan struct{} { return s.source.synced }

// WaitSynced waits until the first index is served, the source fails, or
// timeout passes.
func (s *Server) WaitSynced(timeout time.Duration) error {
	select {
	case <-s.Synced():
		return nil
	case err := <-s.Err():
		return err
	case <-time.After(timeout):
		return fmt.Errorf("the DNS source did not sync within %v", timeout)
	}
}

// Err delivers the failure of the source or of serving, if one stops.
func (s *Server) Err() <-chan error { return s.errc }

// Close stops serving.
func (s *Server) Close() {
	s.cancel()
	_ = s.udp.Shutdown()
	_ = s.tcp.Shutdown()
}

// listenBoth opens UDP and TCP on one port. For "any port" (":0"), a port
// free for UDP may be taken for TCP: then another is tried.
func listenBoth(listen string) (net.PacketConn, net.Listener, error) {
	_, port, _ := net.SplitHostPort(listen)
	for attempt := 0; ; attempt++ {
		pc, err := net.ListenPacket("udp", listen)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on %s (udp): %w", listen, err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l, nil
		}
		pc.Close()
		if port != "0" || attempt == 20 {
			return nil, nil, fmt.Errorf("listening on %s (tcp): %w", pc.LocalAddr(), err)
		}
	}
}
