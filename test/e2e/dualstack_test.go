//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	cmdns "github.com/clustermap/clustermap/internal/dns"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

// dualStack: a PreferDualStack export gives, in every cluster, an import
// with one VIP per family (the derived Service's), an IPv4 and an IPv6
// EndpointSlice holding every ready pod, and DNS answers for A and AAAA.
func (w *world) dualStack(t *testing.T) {
	w.familyExport(t, "dual", []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol})
}

// An IPv6-only pair of clusters imports and answers AAAA only.
func TestIPv6OnlyClusters(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, IPFamily: devenv.IPv6}, Controllers: true})
	w.familyExport(t, "v6only", []corev1.IPFamily{corev1.IPv6Protocol})
}

func (w *world) familyExport(t *testing.T, ns string, families []corev1.IPFamily) {
	w.familyExportFrom(t, 0, ns, families)
}

// familyExportFrom exports a PreferDualStack app from the cluster at index
// from and checks every cluster's import.
func (w *world) familyExportFrom(t *testing.T, from int, ns string, families []corev1.IPFamily) {
	const name = "web"
	w.allNamespaces(t, ns)
	src := w.clients[from]
	app(t, src, ns, name, 3, false, httpPort(80, 8080))
	updateService(t, src, ns, name, func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack) })
	exportService(t, src, ns, name)
	var podIPs []string
	harness.Eventually(t, importDeadline, "pods ready in "+w.env.Clusters[from].ID, func() error {
		var err error
		if podIPs, err = readyPodIPs(src, ns, name); err == nil && len(podIPs) != 3*len(families) {
			err = fmt.Errorf("ready addresses %v, want 3 per family", podIPs)
		}
		return err
	})
	for i, cl := range w.clients {
		c := w.env.Clusters[i]
		var vips []string
		harness.Eventually(t, importDeadline, "the import in "+c.ID, func() error {
			si, err := getImport(cl, ns, name)
			if err != nil {
				return err
			}
			derived := &corev1.Service{}
			if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: imports.DerivedName(name)}, derived); err != nil {
				return err
			}
			if !reflect.DeepEqual(si.Spec.IPFamilies, families) || len(si.Spec.IPs) != len(families) || !reflect.DeepEqual(si.Spec.IPs, derived.Spec.ClusterIPs) {
				return fmt.Errorf("ipFamilies %v ips %v, derived Service %v", si.Spec.IPFamilies, si.Spec.IPs, derived.Spec.ClusterIPs)
			}
			for f, ip := range si.Spec.IPs {
				if !prefixContains(c.ServiceCIDRs[f], ip) {
					return fmt.Errorf("VIP %s is not from %s's range %s", ip, c.ID, c.ServiceCIDRs[f])
				}
			}
			slices, err := importSlices(cl, ns, name)
			if err != nil {
				return err
			}
			if got := readyIPs(slices); !reflect.DeepEqual(got, podIPs) {
				return fmt.Errorf("imported endpoints %v, want %v", got, podIPs)
			}
			perFamily := map[discoveryv1.AddressType]int{}
			for _, s := range slices {
				for _, e := range s.Endpoints {
					a := netip.MustParseAddr(e.Addresses[0])
					if a.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) {
						return fmt.Errorf("slice %s of type %s holds %s", s.Name, s.AddressType, a)
					}
					perFamily[s.AddressType]++
				}
			}
			for _, f := range families {
				if n := perFamily[discoveryv1.AddressType(f)]; n != 3 {
					return fmt.Errorf("%d %s endpoints, want 3", n, f)
				}
			}
			vips = si.Spec.IPs
			return nil
		})
		// clustermap dns answers the VIP of each family, and nothing for a
		// family the import lacks.
		addr := dnsServer(t, c)
		qname := fmt.Sprintf("%s.%s.svc.clusterset.local.", name, ns)
		var got []string
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			m := new(dns.Msg)
			m.SetQuestion(qname, qt)
			r, _, err := (&dns.Client{Net: "udp", Timeout: 2 * time.Second}).Exchange(m, addr)
			harness.Must(t, err)
			for _, rr := range r.Answer {
				switch rr := rr.(type) {
				case *dns.A:
					got = append(got, rr.A.String())
				case *dns.AAAA:
					got = append(got, rr.AAAA.String())
				}
			}
		}
		want := append([]string(nil), vips...)
		sort.Strings(got)
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: DNS answers %v for %s, want the VIPs %v", c.ID, got, qname, want)
		}
	}
	if got := condition(src, ns, name, mcsv1beta1.ServiceExportConditionConflict); got != "False/NoConflicts" {
		t.Errorf("Conflict %s", got)
	}
}

// dnsServer runs clustermap dns against a cluster on loopback.
func dnsServer(t *testing.T, c *devenv.Cluster) string {
	s, err := cmdns.Start(context.Background(), c.Config, "127.0.0.1:0", "clusterset.local", 5, nil)
	harness.Must(t, err)
	t.Cleanup(s.Close)
	harness.Must(t, s.WaitSynced(30*time.Second))
	return s.Addr
}
