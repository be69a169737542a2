// Package verify checks a clusterset's data plane from inside it: a probe
// exported from every cluster, reached from every cluster by its
// clusterset names and addresses. The plan (what to try from each
// cluster) and the diagnosis (what a failure most likely means) are pure;
// run.go deploys, executes and cleans up.
package verify

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/clustermap/clustermap/internal/probe"
)

// Names of what verify deploys in its namespace of each cluster.
const (
	Probe    = "probe"          // the pod, its hostname, and its ClusterSetIP Service
	Headless = "probe-headless" // the headless Service (the pod's subdomain)
	Port     = 8080             // TCP and UDP
	PortName = "probe"
)

// Cluster is one cluster as verify found it once its probe ran.
type Cluster struct {
	Context string `json:"context"`
	ID      string `json:"id"`
	// PodIPs are the probe pod's addresses.
	PodIPs []string `json:"podIPs"`
	// Imported: this cluster's ServiceImport of the probe exists, with
	// ImportIPs (its clusterset IPs) and ImportClusters (the exporting
	// clusters it lists); HeadlessImported likewise for the headless one.
	Imported         bool     `json:"imported"`
	ImportIPs        []string `json:"importIPs,omitempty"`
	ImportClusters   []string `json:"importClusters,omitempty"`
	HeadlessImported bool     `json:"headlessImported"`
	// Error: the probe could not be deployed or did not become ready.
	Error string `json:"error,omitempty"`
}

// Families are the IP families of addresses: "IPv4", "IPv6".
func Families(ips []string) []string {
	var out []string
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			f := family(a)
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	slices.Sort(out)
	return out
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func ofFamily(ips []string, fam string) []string {
	var out []string
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && family(a) == fam {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return out
}

func qtype(fam string) string {
	if fam == "IPv4" {
		return "A"
	}
	return "AAAA"
}

// Item is one check from a cluster, with what it must find. Target is
// the cluster it is about ("" for the clusterset as a whole); a check of
// a clusterset IP is about every cluster it must reach (Want).
type Item struct {
	Target string      `json:"target"`
	What   string      `json:"what"`
	Check  probe.Check `json:"check"`
	Want   []string    `json:"want"`
	// Via: a dial of a clusterset IP, which reaches each of Want.
	Via bool `json:"via,omitempty"`
}

// Checks lists the checks from cluster src (its probe pod) to every cluster
// of all, in namespace ns under zone: the clusterset names (A, AAAA, SRV,
// headless, each cluster's per-pod name), TCP and UDP to each cluster's
// probe pod directly and through the clusterset IP, in every family src
// and the target both have.
func Checks(zone, ns string, src Cluster, all []Cluster) []Item {
	svc := fmt.Sprintf("%s.%s.svc.%s", Probe, ns, zone)
	headless := fmt.Sprintf("%s.%s.svc.%s", Headless, ns, zone)
	fams := Families(src.PodIPs)
	var ready []Cluster
	for _, c := range all {
		if c.Error == "" && len(c.PodIPs) > 0 {
			ready = append(ready, c)
		}
	}
	var allPods []string
	for _, c := range ready {
		allPods = append(allPods, c.PodIPs...)
	}
	items := []Item{{What: "the DNS server answers (dns-version TXT)",
		Check: probe.Check{Kind: "dns", Name: "dns-version." + zone, Type: "TXT"}}}
	for _, fam := range fams {
		vips := ofFamily(src.ImportIPs, fam)
		items = append(items,
			Item{What: qtype(fam) + " " + svc, Check: probe.Check{Kind: "dns", Name: svc, Type: qtype(fam)}, Want: vips},
			Item{What: qtype(fam) + " " + headless, Check: probe.Check{Kind: "dns", Name: headless, Type: qtype(fam)}, Want: ofFamily(allPods, fam)})
		if len(vips) > 0 {
			for _, proto := range []string{"tcp", "udp"} {
				var want []string
				for _, c := range ready {
					if len(ofFamily(c.PodIPs, fam)) > 0 {
						want = append(want, c.ID)
					}
				}
				// Enough tries that every cluster is reached with
				// near certainty when traffic is spread evenly.
				items = append(items, Item{What: fmt.Sprintf("%s to the clusterset IP %s", proto, vips[0]), Via: true, Want: want,
					Check: probe.Check{Kind: proto, Addr: netip.AddrPortFrom(netip.MustParseAddr(vips[0]), Port).String(), Tries: 8 * len(want)}})
			}
		}
	}
	items = append(items, Item{What: "SRV _" + PortName + "._tcp." + svc,
		Check: probe.Check{Kind: "dns", Name: "_" + PortName + "._tcp." + svc, Type: "SRV"},
		Want:  []string{fmt.Sprintf("%d %s.", Port, svc)}})
	for _, t := range ready {
		name := fmt.Sprintf("%s.%s.%s", Probe, t.ID, headless)
		for _, fam := range fams {
			ips := ofFamily(t.PodIPs, fam)
			if len(ips) == 0 {
				continue
			}
			items = append(items, Item{Target: t.ID, What: qtype(fam) + " " + name,
				Check: probe.Check{Kind: "dns", Name: name, Type: qtype(fam)}, Want: ips})
			for _, ip := range ips {
				for _, proto := range []string{"tcp", "udp"} {
					items = append(items, Item{Target: t.ID, What: fmt.Sprintf("%s to the pod %s", proto, ip), Want: []string{t.ID},
						Check: probe.Check{Kind: proto, Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), Port).String(), Tries: 1}})
				}
			}
		}
	}
	return items
}
