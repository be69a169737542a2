package dns

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/locality"
)

// testIndex: a ClusterSetIP import "web" (IPv4, port http/80) and a
// headless "db" with endpoints in two clusters, in namespace shop.
func testIndex() *Index {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	imports := []mcsv1beta1.ServiceImport{
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.201.0.10"}, Ports: []mcsv1beta1.ServicePort{http}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{{Name: "db", Protocol: corev1.ProtocolTCP, Port: 5432}}}},
	}
	slice := func(cluster string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-" + cluster,
			Labels: map[string]string{mcsv1beta1.LabelServiceName: "db", mcsv1beta1.LabelSourceCluster: cluster}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("db"), Port: ptr.To[int32](5432), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	}
	ep := func(ip, host string, ready bool) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
		if host != "" {
			e.Hostname = ptr.To(host)
		}
		return e
	}
	slices := []discoveryv1.EndpointSlice{
		slice("cluster-1", ep("10.101.0.1", "db-0", true), ep("10.101.0.2", "db-1", true), ep("10.101.0.3", "db-2", false)),
		slice("cluster-2", ep("10.102.0.9", "", true)),
	}
	return Build("clusterset.local", 5, imports, slices, []string{"shop", "empty"})
}

func values(rrs []dns.RR) string {
	var out []string
	for _, rr := range rrs {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, r.A.String())
		case *dns.AAAA:
			out = append(out, r.AAAA.String())
		case *dns.SRV:
			out = append(out, r.Target)
		default:
			out = append(out, dns.TypeToString[rr.Header().Rrtype])
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// The handler answers from the index alone, as the server does for every
// query (the e2e test asks it over UDP and TCP on a real cluster).
func TestAnswers(t *testing.T) {
	h := NewHandler(5, nil)
	h.SetIndex(testIndex())
	for _, c := range []struct {
		name      string
		qtype     uint16
		rcode     int
		answer    string
		authority string
	}{
		{"web.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.201.0.10", ""},
		{"WEB.Shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.201.0.10", ""},
		{"web.shop.svc.clusterset.local.", dns.TypeAAAA, dns.RcodeSuccess, "", "SOA"}, // NODATA
		{"_http._tcp.web.shop.svc.clusterset.local.", dns.TypeSRV, dns.RcodeSuccess, "web.shop.svc.clusterset.local.", ""},
		{"db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.101.0.1,10.101.0.2,10.102.0.9", ""}, // ready only
		{"db-1.cluster-1.db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.101.0.2", ""},
		{"10-102-0-9.cluster-2.db.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "10.102.0.9", ""},
		{"nope.shop.svc.clusterset.local.", dns.TypeA, dns.RcodeNameError, "", "SOA"},
		{"empty.svc.clusterset.local.", dns.TypeA, dns.RcodeSuccess, "", "SOA"}, // a namespace: the name exists
		{"example.com.", dns.TypeA, dns.RcodeRefused, "", ""},                   // never recursed
		{"web.shop.svc.clusterset.local.", dns.TypeANY, dns.RcodeNotImplemented, "", ""},
	} {
		req := new(dns.Msg)
		req.SetQuestion(c.name, c.qtype)
		m := h.answer(req)
		if m.Rcode != c.rcode || values(m.Answer) != c.answer || values(m.Ns) != c.authority {
			t.Errorf("%s %s: rcode %s answer %q authority %q; want %s %q %q", c.name, dns.TypeToString[c.qtype],
				dns.RcodeToString[m.Rcode], values(m.Answer), values(m.Ns), dns.RcodeToString[c.rcode], c.answer, c.authority)
		}
	}
}

// A headless import that routes local first answers its name with the
// endpoints hinted for a zone of this cluster; each endpoint's own name
// still answers.
func TestHeadlessLocalFirst(t *testing.T) {
	hinted := func(ip, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}}
	}
	port := []discoveryv1.EndpointPort{{Name: ptr.To("db"), Port: ptr.To[int32](5432), Protocol: ptr.To(corev1.ProtocolTCP)}}
	slice := func(cluster string, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-" + cluster,
			Labels: map[string]string{mcsv1beta1.LabelServiceName: "db", mcsv1beta1.LabelSourceCluster: cluster}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps, Ports: port}
	}
	ix := Build("clusterset.local", 5, []mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless}}},
		[]discoveryv1.EndpointSlice{slice("here", hinted("10.1.0.1", "zone-a")), slice("there", hinted("10.2.0.1", locality.Nowhere))}, []string{"shop"})
	h := NewHandler(5, nil)
	h.SetIndex(ix)
	for name, want := range map[string]string{
		"db.shop.svc.clusterset.local.":                "10.1.0.1",
		"10-2-0-1.there.db.shop.svc.clusterset.local.": "10.2.0.1",
		"_db._tcp.db.shop.svc.clusterset.local./SRV":   "10-1-0-1.here.db.shop.svc.clusterset.local.",
		"10-1-0-1.here.db.shop.svc.clusterset.local.":  "10.1.0.1",
	} {
		q, qt := name, dns.TypeA
		if n, ok := strings.CutSuffix(name, "/SRV"); ok {
			q, qt = n, dns.TypeSRV
		}
		req := new(dns.Msg)
		req.SetQuestion(q, qt)
		if got := values(h.answer(req).Answer); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

// A dual-stack import holds every record once: a headless import's pods
// are listed in one slice per family (the same hostnames), and a
// ClusterSetIP import has one VIP per family for its one port.
func TestDualStackAnswersOnce(t *testing.T) {
	port := []discoveryv1.EndpointPort{{Name: ptr.To("db"), Port: ptr.To[int32](5432), Protocol: ptr.To(corev1.ProtocolTCP)}}
	slice := func(family discoveryv1.AddressType, ips ...string) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-" + strings.ToLower(string(family)),
			Labels: map[string]string{mcsv1beta1.LabelServiceName: "db", mcsv1beta1.LabelSourceCluster: "cluster-1"}},
			AddressType: family, Ports: port}
		for i, ip := range ips {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Hostname: ptr.To(fmt.Sprintf("db-%d", i)),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return s
	}
	dbPort := mcsv1beta1.ServicePort{Name: "db", Protocol: corev1.ProtocolTCP, Port: 5432}
	ix := Build("clusterset.local", 5, []mcsv1beta1.ServiceImport{
		{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{dbPort}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP,
			IPs: []string{"10.201.0.10", "fd00:201::10"}, Ports: []mcsv1beta1.ServicePort{dbPort}}},
	}, []discoveryv1.EndpointSlice{
		slice(discoveryv1.AddressTypeIPv4, "10.1.0.1", "10.1.0.2"),
		slice(discoveryv1.AddressTypeIPv6, "fd00:1::1", "fd00:1::2"),
	}, []string{"shop"})
	h := NewHandler(5, nil)
	h.SetIndex(ix)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"db.shop.svc.clusterset.local.", dns.TypeSRV, "db-0.cluster-1.db.shop.svc.clusterset.local.,db-1.cluster-1.db.shop.svc.clusterset.local."},
		{"_db._tcp.db.shop.svc.clusterset.local.", dns.TypeSRV, "db-0.cluster-1.db.shop.svc.clusterset.local.,db-1.cluster-1.db.shop.svc.clusterset.local."},
		{"db-0.cluster-1.db.shop.svc.clusterset.local.", dns.TypeA, "10.1.0.1"},
		{"db-0.cluster-1.db.shop.svc.clusterset.local.", dns.TypeAAAA, "fd00:1::1"},
		{"db.shop.svc.clusterset.local.", dns.TypeAAAA, "fd00:1::1,fd00:1::2"},
		{"web.shop.svc.clusterset.local.", dns.TypeSRV, "web.shop.svc.clusterset.local."},
		{"_db._tcp.web.shop.svc.clusterset.local.", dns.TypeSRV, "web.shop.svc.clusterset.local."},
		{"web.shop.svc.clusterset.local.", dns.TypeAAAA, "fd00:201::10"},
	} {
		req := new(dns.Msg)
		req.SetQuestion(c.name, c.qtype)
		if got := values(h.answer(req).Answer); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.name, dns.TypeToString[c.qtype], got, c.want)
		}
	}
}
