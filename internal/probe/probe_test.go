package probe

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The server answers TCP and UDP on both families with its cluster; the
// checker reports who answered, and classifies a port nobody serves.
func TestServeAndDial(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, port, "cluster-7", "probe") }()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitListening(t, addr)
	closed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	checks := []Check{
		{Kind: "tcp", Addr: addr, Tries: 3},
		{Kind: "udp", Addr: addr, Tries: 3},
		{Kind: "tcp", Addr: fmt.Sprintf("[::1]:%d", port)},
		{Kind: "tcp", Addr: closed},
		{Kind: "udp", Addr: closed},
	}
	got := Run(context.Background(), checks, nil, time.Second)
	for i := range 3 {
		if !slices.Equal(got[i].Answers, []string{"cluster-7"}) || got[i].Failed != 0 {
			t.Errorf("%+v: %+v, want cluster-7 every time", checks[i], got[i])
		}
	}
	for i := 3; i < 5; i++ {
		if got[i].Class != Refused || got[i].Failed != 1 {
			t.Errorf("%+v: %+v, want refused", checks[i], got[i])
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
}

// Lookups: records sorted, SRV as "port target", NXDOMAIN and NODATA
// told apart, a server that does not answer is a DNS error.
func TestLookup(t *testing.T) {
	mux := dns.NewServeMux()
	mux.HandleFunc("clusterset.local.", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case q.Name == "web.ns.svc.clusterset.local." && q.Qtype == dns.TypeA:
			for _, ip := range []string{"10.0.0.2", "10.0.0.1"} {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)})
			}
		case q.Name == "_http._tcp.web.ns.svc.clusterset.local." && q.Qtype == dns.TypeSRV:
			m.Answer = append(m.Answer, &dns.SRV{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 5},
				Port: 80, Target: "web.ns.svc.clusterset.local."})
		case q.Name == "web.ns.svc.clusterset.local.":
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	// A resolv.conf as a kubelet writes it.
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("search ns.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Servers(conf); err != nil || !slices.Equal(s, []string{"10.96.0.10:53"}) {
		t.Errorf("Servers: %v %v", s, err)
	}
	checks := []Check{
		{Kind: "dns", Name: "web.ns.svc.clusterset.local", Type: "A"},
		{Kind: "dns", Name: "_http._tcp.web.ns.svc.clusterset.local", Type: "SRV"},
		{Kind: "dns", Name: "web.ns.svc.clusterset.local", Type: "AAAA"},
		{Kind: "dns", Name: "gone.ns.svc.clusterset.local", Type: "A"},
	}
	got := Run(context.Background(), checks, []string{pc.LocalAddr().String()}, time.Second)
	want := []Result{
		{Answers: []string{"10.0.0.1", "10.0.0.2"}},
		{Answers: []string{"80 web.ns.svc.clusterset.local."}},
		{Failed: 1, Class: NoData},
		{Failed: 1, Class: NXDomain},
	}
	for i := range want {
		if !slices.Equal(got[i].Answers, want[i].Answers) || got[i].Class != want[i].Class || got[i].Failed != want[i].Failed {
			t.Errorf("%+v: %+v, want %+v", checks[i], got[i], want[i])
		}
	}
	silent := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	if r := Run(context.Background(), checks[:1], []string{silent}, 300*time.Millisecond)[0]; r.Class != DNSError {
		t.Errorf("a server that does not answer: %+v", r)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never listened", addr)
}
