// Package dns serves the clusterset.local zone from the cluster's
// ServiceImports and their EndpointSlices: an in-memory index rebuilt on
// every change, so that no query ever calls the API server.
package dns

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/locality"
)

// SchemaVersion is the multicluster DNS specification version served at
// dns-version.<zone>.
const SchemaVersion = "1.1.0"

// Index is the zone, precomputed: for every name, its records by type.
type Index struct {
	Zone  string // fully qualified, lowercase: "clusterset.local."
	names map[string]map[uint16][]dns.RR
	// ptr answers reverse lookups of the addresses the zone serves.
	ptr map[string][]dns.RR
}

// Lookup returns the records of a name and type, and whether the name
// exists at all (for NXDOMAIN versus NODATA).
func (ix *Index) Lookup(name string, qtype uint16) ([]dns.RR, bool) {
	name = strings.ToLower(name)
	if rrs, ok := ix.ptr[name]; ok {
		if qtype == dns.TypePTR {
			return rrs, true
		}
		return nil, true
	}
	types, ok := ix.names[name]
	if !ok {
		return nil, false
	}
	return types[qtype], true
}

// InZone tells whether a name is in the zone (or a reverse name it serves).
func (ix *Index) InZone(name string) bool {
	name = strings.ToLower(name)
	_, isPTR := ix.ptr[name]
	return isPTR || dns.IsSubDomain(ix.Zone, name)
}

// SOA is the zone's start of authority, for negative answers.
func (ix *Index) SOA(ttl uint32) dns.RR {
	return &dns.SOA{
		Hdr: dns.RR_Header{Name: ix.Zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
		Ns:  "ns.dns." + ix.Zone, Mbox: "hostmaster." + ix.Zone,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: ttl,
	}
}

type builder struct {
	ix  *Index
	ttl uint32
	// added holds every record once: a dual-stack import lists a pod in
	// one slice per family, and its name and ports must answer once.
	added map[string]bool
}

// fresh tells whether rr (its header complete) is not in the zone yet.
func (b *builder) fresh(rr dns.RR) bool {
	k := rr.String()
	if b.added[k] {
		return false
	}
	b.added[k] = true
	return true
}

func (b *builder) add(rr dns.RR) {
	h := rr.Header()
	h.Name = strings.ToLower(h.Name)
	h.Class, h.Ttl = dns.ClassINET, b.ttl
	if !b.fresh(rr) {
		return
	}
	types := b.ix.names[h.Name]
	if types == nil {
		types = map[uint16][]dns.RR{}
		b.ix.names[h.Name] = types
	}
	types[h.Rrtype] = append(types[h.Rrtype], rr)
	// Every ancestor up to the zone exists (empty non-terminals answer
	// NODATA, not NXDOMAIN).
	for n := h.Name; n != b.ix.Zone; {
		i, end := dns.NextLabel(n, 0)
		if end {
			break
		}
		n = n[i:]
		if _, ok := b.ix.names[n]; !ok {
			b.ix.names[n] = map[uint16][]dns.RR{}
		}
		if n == b.ix.Zone {
			break
		}
	}
}

// address adds an A or AAAA record, and the PTR record back to the name.
func (b *builder) address(name, ip string) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return
	}
	hdr := dns.RR_Header{Name: name}
	if a.Is4() {
		hdr.Rrtype = dns.TypeA
		b.add(&dns.A{Hdr: hdr, A: a.AsSlice()})
	} else {
		hdr.Rrtype = dns.TypeAAAA
		b.add(&dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
	}
	rev, err := dns.ReverseAddr(ip)
	if err != nil {
		return
	}
	if p := (&dns.PTR{Hdr: dns.RR_Header{Name: rev, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: b.ttl}, Ptr: strings.ToLower(name)}); b.fresh(p) {
		b.ix.ptr[rev] = append(b.ix.ptr[rev], p)
	}
}

func (b *builder) srv(name, target string, port int32) {
	b.add(&dns.SRV{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeSRV}, Priority: 0, Weight: 10, Port: uint16(port), Target: strings.ToLower(target)})
}

// Build indexes the zone. Slices are the MCS-labelled EndpointSlices of the
// cluster; namespaces are the cluster's namespaces (their names exist in
// the zone even without imports).
func Build(zone string, ttl uint32, imports []mcsv1beta1.ServiceImport, slices []discoveryv1.EndpointSlice, namespaces []string) *Index {
	zone = dns.Fqdn(strings.ToLower(zone))
	b := &builder{ix: &Index{Zone: zone, names: map[string]map[uint16][]dns.RR{}, ptr: map[string][]dns.RR{}}, ttl: ttl, added: map[string]bool{}}
	b.add(&dns.SOA{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA}, Ns: "ns.dns." + zone, Mbox: "hostmaster." + zone,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: ttl})
	b.add(&dns.NS{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeNS}, Ns: "ns.dns." + zone})
	b.add(&dns.TXT{Hdr: dns.RR_Header{Name: "dns-version." + zone, Rrtype: dns.TypeTXT}, Txt: []string{SchemaVersion}})
	for _, ns := range namespaces {
		if _, ok := b.ix.names[ns+".svc."+zone]; !ok {
			b.ix.names[strings.ToLower(ns+".svc."+zone)] = map[uint16][]dns.RR{}
		}
	}
	b.ix.names["svc."+zone] = map[uint16][]dns.RR{}

	type key struct{ ns, name string }
	bySvc := map[key][]discoveryv1.EndpointSlice{}
	for _, s := range slices {
		k := key{s.Namespace, s.Labels[mcsv1beta1.LabelServiceName]}
		bySvc[k] = append(bySvc[k], s)
	}
	for _, si := range imports {
		svcName := fmt.Sprintf("%s.%s.svc.%s", si.Name, si.Namespace, zone)
		switch si.Spec.Type {
		case mcsv1beta1.ClusterSetIP:
			for _, ip := range si.Spec.IPs {
				b.address(svcName, ip)
			}
			for _, p := range si.Spec.Ports {
				b.srv(svcName, svcName, p.Port)
				if p.Name != "" {
					b.srv(fmt.Sprintf("_%s._%s.%s", p.Name, strings.ToLower(string(p.Protocol)), svcName), svcName, p.Port)
				}
			}
		case mcsv1beta1.Headless:
			b.headless(svcName, bySvc[key{si.Namespace, si.Name}])
		}
	}
	return b.ix
}

// headless: the service name answers every ready endpoint of every
// cluster; each endpoint also has <hostname>.<cluster>.<svc> (its IP with
// dashes when it has no hostname), which the SRV records point at. An
// import that routes local first (its endpoints carry zone hints) answers
// the service name with the endpoints some zone of this cluster uses: the
// answer cannot tell the asker's zone.
func (b *builder) headless(svcName string, slices []discoveryv1.EndpointSlice) {
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	for _, s := range slices {
		cluster := s.Labels[mcsv1beta1.LabelSourceCluster]
		for _, e := range s.Endpoints {
			if !kube.EndpointReady(e.Conditions) {
				continue
			}
			named := e.Hints == nil || locality.Used(zoneNames(e.Hints))
			for _, ip := range e.Addresses {
				host := strings.NewReplacer(".", "-", ":", "-").Replace(ip)
				if e.Hostname != nil && *e.Hostname != "" {
					host = *e.Hostname
				}
				target := fmt.Sprintf("%s.%s.%s", host, cluster, svcName)
				if named {
					b.address(svcName, ip)
				}
				b.address(target, ip)
				for _, sp := range s.Ports {
					if sp.Port == nil {
						continue
					}
					name := ptr.Deref(sp.Name, "")
					// Clients of a headless service reach the pods directly:
					// the endpoint's port, not the service's.
					port := *sp.Port
					if !named {
						continue
					}
					b.srv(svcName, target, port)
					if name != "" {
						proto := "tcp"
						if sp.Protocol != nil {
							proto = strings.ToLower(string(*sp.Protocol))
						}
						b.srv(fmt.Sprintf("_%s._%s.%s", name, proto, svcName), target, port)
					}
				}
			}
		}
	}
}

func zoneNames(h *discoveryv1.EndpointHints) []string {
	out := make([]string, len(h.ForZones))
	for i, z := range h.ForZones {
		out[i] = z.Name
	}
	return out
}
