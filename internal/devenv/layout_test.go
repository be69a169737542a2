package devenv

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestLayoutRangesAreDistinct(t *testing.T) {
	specs, err := Layout("p", MaxClusters, 32700)
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
		for _, c := range append([]string{s.PodCIDR}, s.ServiceCIDRs...) {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				t.Fatalf("%s: %v", s.ID, err)
			}
			prefixes = append(prefixes, p)
		}
		if len(s.ServiceCIDRs) != 2 || !strings.Contains(s.ServiceCIDRs[1], ":") {
			t.Errorf("%s: want an IPv4 and an IPv6 service range, got %v", s.ID, s.ServiceCIDRs)
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
		if _, err := Layout("p", n, 0); err == nil || !strings.Contains(err.Error(), "--clusters must be between 1 and") {
			t.Errorf("Layout(%d): got %v, want a --clusters error", n, err)
		}
	}
	specs, err := Layout("p", 1, 0)
	if err != nil || specs[0].APIServerPort != 0 {
		t.Errorf("without a port base the port is kwokctl's choice: %+v %v", specs, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
