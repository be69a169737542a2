//go:build e2e

package dns_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	cmdns "github.com/clustermap/clustermap/internal/dns"
	"github.com/clustermap/clustermap/test/harness"
)

const zone = "clusterset.local."

func slice(ns, svc, cluster, name string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			mcsv1beta1.LabelServiceName: svc, mcsv1beta1.LabelSourceCluster: cluster, discoveryv1.LabelManagedBy: "controller.clustermap.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("db"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
		Endpoints:   eps,
	}
}

func endpoint(ip, hostname string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
	if hostname != "" {
		e.Hostname = ptr.To(hostname)
	}
	return e
}

// server runs the DNS server on loopback, UDP and TCP, fed from cluster c.
func server(t *testing.T, c *devenv.Cluster) string {
	s, err := cmdns.Start(context.Background(), c.Config, "127.0.0.1:0", zone, 5, nil)
	harness.Must(t, err)
	t.Cleanup(s.Close)
	harness.Must(t, s.WaitSynced(30*time.Second))
	return s.Addr
}

// udpAnswer asks for name's A records over UDP and returns the answer and
// its size on the wire.
func udpAnswer(t *testing.T, addr, name string, edns uint16) (int, *dns.Msg) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	if edns > 0 {
		m.SetEdns0(edns, false)
	}
	conn, err := net.Dial("udp", addr)
	harness.Must(t, err)
	defer conn.Close()
	q, err := m.Pack()
	harness.Must(t, err)
	harness.Must(t, conn.SetDeadline(time.Now().Add(2*time.Second)))
	_, err = conn.Write(q)
	harness.Must(t, err)
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	harness.Must(t, err)
	r := new(dns.Msg)
	harness.Must(t, r.Unpack(buf[:n]))
	return n, r
}

func query(t *testing.T, addr, net string, name string, qtype uint16, edns uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns > 0 {
		m.SetEdns0(edns, false)
	}
	c := &dns.Client{Net: net, Timeout: 2 * time.Second, UDPSize: 65535}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], net, err)
	}
	return r
}

func answers(r *dns.Msg) string {
	var out []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		case *dns.SRV:
			out = append(out, fmt.Sprintf("%d %s", v.Port, v.Target))
		case *dns.TXT:
			out = append(out, strings.Join(v.Txt, ""))
		case *dns.PTR:
			out = append(out, v.Ptr)
		default:
			out = append(out, dns.TypeToString[rr.Header().Rrtype])
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestDNSServesImports(t *testing.T) {
	env := harness.Clusters(t, 1)
	cl := harness.Client(t, env.Clusters[0].Config)
	ctx := context.Background()
	harness.Must(t, cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}))
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	for _, si := range []*mcsv1beta1.ServiceImport{
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "demo"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.201.0.10"}, Ports: []mcsv1beta1.ServicePort{http}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "v6", Namespace: "demo"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"fd00:10:201::a"}, Ports: []mcsv1beta1.ServicePort{http}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "demo"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{{Name: "db", Protocol: corev1.ProtocolTCP, Port: 5432}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "demo"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{{Name: "db", Protocol: corev1.ProtocolTCP, Port: 5432}}}},
	} {
		harness.Must(t, cl.Create(ctx, si))
	}
	harness.Must(t, cl.Create(ctx, slice("demo", "db", "cluster-1", "db-c1", 5432, endpoint("10.101.0.1", "db-0"), endpoint("10.101.0.2", "db-1"))))
	harness.Must(t, cl.Create(ctx, slice("demo", "db", "cluster-2", "db-c2", 5433, endpoint("10.102.0.9", ""))))
	for n := 0; n < 3; n++ {
		var eps []discoveryv1.Endpoint
		for i := 0; i < 100; i++ {
			eps = append(eps, endpoint(fmt.Sprintf("10.103.%d.%d", n, i), ""))
		}
		harness.Must(t, cl.Create(ctx, slice("demo", "big", "cluster-3", fmt.Sprintf("big-%d", n), 5432, eps...)))
	}
	addr := server(t, env.Clusters[0])

	cases := []struct {
		name  string
		qtype uint16
		rcode int
		want  string
	}{
		{"web.demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.201.0.10"},
		{"WEB.Demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.201.0.10"},
		{"web.demo.svc.clusterset.local.", dns.TypeAAAA, dns.RcodeSuccess, ""}, // NODATA
		{"v6.demo.svc.clusterset.local.", dns.TypeAAAA, dns.RcodeSuccess, "fd00:10:201::a"},
		{"_http._tcp.web.demo.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, "80 web.demo.svc.clusterset.local."},
		{"web.demo.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, "80 web.demo.svc.clusterset.local."},
		{"db.demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.101.0.1,10.101.0.2,10.102.0.9"},
		{"db-1.cluster-1.db.demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.101.0.2"},
		{"10-102-0-9.cluster-2.db.demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.102.0.9"},
		{"_db._tcp.db.demo.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess,
			"5432 db-0.cluster-1.db.demo.svc.clusterset.local.,5432 db-1.cluster-1.db.demo.svc.clusterset.local.,5433 10-102-0-9.cluster-2.db.demo.svc.clusterset.local."},
		{"dns-version.clusterset.local.", dns.TypeTXT, dns.RcodeSuccess, "1.1.0"},
		{"clusterset.local.", dns.TypeSOA, dns.RcodeSuccess, "SOA"},
		{"clusterset.local.", dns.TypeNS, dns.RcodeSuccess, "NS"},
		{"10.0.201.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, "web.demo.svc.clusterset.local."},
		{"nope.demo.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, ""},
		{"demo.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, ""}, // a namespace: NODATA
		{"example.com.", dns.TypeA, dns.RcodeRefused, ""},
		{"1.1.168.192.in-addr.arpa.", dns.TypePTR, dns.RcodeRefused, ""},
		{"web.demo.svc.clusterset.local.", dns.TypeANY, dns.RcodeNotImplemented, ""},
	}
	for _, net := range []string{"udp", "tcp"} {
		for _, c := range cases {
			r := query(t, addr, net, c.name, c.qtype, 0)
			if r.Rcode != c.rcode || answers(r) != c.want {
				t.Errorf("%s %s %s: %s %q, want %s %q", net, c.name, dns.TypeToString[c.qtype], dns.RcodeToString[r.Rcode], answers(r), dns.RcodeToString[c.rcode], c.want)
			}
			if (c.rcode == dns.RcodeNameError || (c.rcode == dns.RcodeSuccess && c.want == "")) && (len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA) {
				t.Errorf("%s %s: a negative answer carries the SOA: %v", net, c.name, r.Ns)
			}
		}
	}

	// 300 endpoints: whole over TCP; over UDP truncated (TC, so that the
	// client asks again over TCP) to 512 bytes without EDNS0 and to 1,232
	// whatever larger buffer a client offers: no 4 KB answer to a spoofed
	// 60-byte query.
	r := query(t, addr, "udp", "big.demo.svc.clusterset.local.", dns.TypeA, 0)
	if !r.Truncated || len(r.Answer) >= 300 {
		t.Errorf("UDP without EDNS0: truncated %v with %d answers", r.Truncated, len(r.Answer))
	}
	if r := query(t, addr, "tcp", "big.demo.svc.clusterset.local.", dns.TypeA, 0); r.Truncated || len(r.Answer) != 300 {
		t.Errorf("TCP: truncated %v with %d answers, want 300", r.Truncated, len(r.Answer))
	}
	if n, _ := udpAnswer(t, addr, "big.demo.svc.clusterset.local.", 0); n > dns.MinMsgSize {
		t.Errorf("UDP without EDNS0: a %d-byte answer", n)
	}
	for _, buf := range []uint16{1232, 8192} {
		n, r := udpAnswer(t, addr, "big.demo.svc.clusterset.local.", buf)
		if !r.Truncated || len(r.Answer) < 50 || n > cmdns.MaxUDPSize {
			t.Errorf("UDP with a %d-byte EDNS0 buffer: truncated %v with %d answers in %d bytes", buf, r.Truncated, len(r.Answer), n)
		}
	}

	// An EndpointSlice change is answered within a second.
	s := &discoveryv1.EndpointSlice{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: "demo", Name: "db-c2"}, s))
	s.Endpoints = append(s.Endpoints, endpoint("10.102.0.10", ""))
	changed := time.Now()
	harness.Must(t, cl.Update(ctx, s))
	for !strings.Contains(answers(query(t, addr, "udp", "db.demo.svc.clusterset.local.", dns.TypeA, 0)), "10.102.0.10") {
		if time.Since(changed) > time.Second {
			t.Fatalf("the new endpoint is not answered a second after the change")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("an EndpointSlice change answered after %v", time.Since(changed).Round(time.Millisecond))

	// Bad packets get an rcode (or nothing), and the server keeps serving.
	raw := func(b []byte) *dns.Msg {
		conn, err := net.Dial("udp", addr)
		harness.Must(t, err)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		_, _ = conn.Write(b)
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		if err != nil {
			return nil
		}
		m := new(dns.Msg)
		if m.Unpack(buf[:n]) != nil {
			return nil
		}
		return m
	}
	raw([]byte("this is not a DNS packet"))
	noQuestion := (&dns.Msg{MsgHdr: dns.MsgHdr{Id: 7, Opcode: dns.OpcodeQuery}})
	b, _ := noQuestion.Pack()
	if r := raw(b); r == nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("a query without a question: %v", r)
	}
	two := new(dns.Msg)
	two.SetQuestion("web.demo.svc.clusterset.local.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	b, _ = two.Pack()
	if r := raw(b); r == nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("a query with two questions: %v", r)
	}
	// A 300-byte name: labels of 63 bytes, built by hand (packing refuses it).
	long := []byte{0, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for i := 0; i < 5; i++ {
		long = append(long, 63)
		long = append(long, []byte(strings.Repeat("a", 63))...)
	}
	long = append(long, 0, 0, 1, 0, 1)
	if r := raw(long); r == nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("an oversized name: want FORMERR, got %v", r)
	}
	if r := query(t, addr, "udp", "web.demo.svc.clusterset.local.", dns.TypeA, 0); answers(r) != "10.201.0.10" {
		t.Errorf("after bad packets the server answers %q", answers(r))
	}
}
