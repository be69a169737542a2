//go:build linux

package devenv

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestLayoutRangesAreDistinct(t *testing.T) {
	specs, err := Layout("p", MaxClusters, 32700, DualStack)
	if err != nil {
		t.Fatal(err)
	}
	var prefixes []netip.Prefix
	for i, s := range specs {
		if want := "cluster-" + itoa(i+1); s.ID != want || s.KwokName != "p-"+want {
			t.Errorf("cluster %d: id %q kwok name %q", i+1, s.ID, s.KwokName)
		}
		if s.APIServerPort != 32700+i+1 {
			t.Errorf("%s: port %d", s.ID, s.APIServerPort)
		}
		for _, c := range append(append([]string{}, s.PodCIDRs...), s.ServiceCIDRs...) {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				t.Fatalf("%s: %v", s.ID, err)
			}
			prefixes = append(prefixes, p)
		}
		if len(s.ServiceCIDRs) != 2 || !strings.Contains(s.ServiceCIDRs[1], ":") || len(s.PodCIDRs) != 2 || !strings.Contains(s.PodCIDRs[1], ":") {
			t.Errorf("%s: want IPv4 and IPv6 pod and service ranges, got %v %v", s.ID, s.PodCIDRs, s.ServiceCIDRs)
		}
		// Every node's slices lie in the cluster's ranges and are distinct.
		seen := map[string]bool{}
		for n := 1; n <= MaxNodes; n++ {
			for f, c := range s.NodePodCIDRs(n) {
				np := netip.MustParsePrefix(c)
				if cp := netip.MustParsePrefix(s.PodCIDRs[f]); !cp.Contains(np.Addr()) || (np.Bits() != 22 && np.Bits() != 64) || np != np.Masked() || seen[c] {
					t.Fatalf("%s node %d: slice %s of %s", s.ID, n, c, cp)
				}
				seen[c] = true
			}
		}
	}
	for i := range prefixes {
		for j := i + 1; j < len(prefixes); j++ {
			if prefixes[i].Overlaps(prefixes[j]) {
				t.Errorf("%s overlaps %s", prefixes[i], prefixes[j])
			}
		}
	}
}

func TestLayoutRejectsBadCounts(t *testing.T) {
	for _, n := range []int{0, -1, MaxClusters + 1} {
		if _, err := Layout("p", n, 0, DualStack); err == nil || !strings.Contains(err.Error(), "--clusters must be between 1 and") {
			t.Errorf("Layout(%d): got %v, want a --clusters error", n, err)
		}
	}
	specs, err := Layout("p", 1, 0, DualStack)
	if err != nil || specs[0].APIServerPort != 0 {
		t.Errorf("without a port base the port is kwokctl's choice: %+v %v", specs, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestLayoutFamilies(t *testing.T) {
	for fam, want := range map[string]string{IPv4: "10.101.0.0/16", IPv6: "fd00:10:101::/56"} {
		specs, err := Layout("p", 1, 0, fam)
		if err != nil {
			t.Fatal(err)
		}
		if s := specs[0]; len(s.PodCIDRs) != 1 || s.PodCIDRs[0] != want || len(s.ServiceCIDRs) != 1 {
			t.Errorf("%s: pods %v services %v", fam, s.PodCIDRs, s.ServiceCIDRs)
		}
	}
	if got := (ClusterSpec{PodCIDRs: []string{"10.101.0.0/16", "fd00:10:101::/56"}}).NodePodCIDRs(3); got[0] != "10.101.12.0/22" || got[1] != "fd00:10:101:3::/64" {
		t.Errorf("node 3: %v", got)
	}
	if _, err := Layout("p", 1, 0, "ipv5"); err == nil || !strings.Contains(err.Error(), "--ip-family") {
		t.Errorf("bad family: %v", err)
	}
}
