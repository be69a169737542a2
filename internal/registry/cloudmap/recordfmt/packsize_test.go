package recordfmt

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"

	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
)

// The packed-size table of docs/scale.md, built from the Services it
// names and encoded as an exporter would; the test fails when the doc
// says otherwise. Addresses are consecutive (fleetExport) or random: IPv4
// drawn from a /16 pod range, IPv6 interface ids drawn at random.
func TestPackedSizeTable(t *testing.T) {
	one := func(v6, random bool) int { // the most pods of one port that fit the service record
		lo, hi := 1, 4000
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if packedInstances(t, mid, v6, random, recordfmttest.ThreePorts[:1]) == 1 {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return lo
	}
	rows := []string{
		fmt.Sprintf("| one Service's pods in its service record, single-stack, 1 port | %d (random addresses), %d (consecutive) |", one(false, true), one(false, false)),
		fmt.Sprintf("| the same, dual-stack | %d (random IPv6 interface ids), %d (consecutive) |", one(true, true), one(true, false)),
	}
	for _, c := range []struct {
		pods  int
		v6    bool
		ports int
	}{{2000, true, 3}, {5000, false, 2}, {5000, true, 2}} {
		stack := "single-stack"
		if c.v6 {
			stack = "dual-stack"
		}
		rows = append(rows, fmt.Sprintf("| %s pods, %s, %d ports | %d (random), %d (consecutive) |", thousands(c.pods), stack, c.ports,
			packedInstances(t, c.pods, c.v6, true, recordfmttest.ThreePorts[:c.ports]), packedInstances(t, c.pods, c.v6, false, recordfmttest.ThreePorts[:c.ports])))
	}
	table := "| pods of one Service in one cluster | instances |\n| --- | --- |\n" + strings.Join(rows, "\n") + "\n"
	t.Logf("packed records (TestPackedSizeTable):\n%s", table)
	doc, err := os.ReadFile("../../../../docs/scale.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), table) {
		t.Errorf("docs/scale.md does not hold the packed-size table as measured; put this there:\n%s", table)
	}
}

// packedInstances is how many instances a Service of pods takes packed.
func packedInstances(t *testing.T, pods int, v6, random bool, ports []mcsv1beta1.ServicePort) int {
	t.Helper()
	e := recordfmttest.FleetExport("c1", pods, v6, ports...)
	if random {
		randomAddresses(&e)
	}
	enc, err := EncodePacked(e, "clustermap test", nil)
	if err != nil {
		t.Fatal(err)
	}
	for id, a := range enc {
		if err := checkLimits(a); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	return len(enc)
}

// randomAddresses gives each pod of e another address (a fixed seed: the
// table is the same every run): IPv4 from 10.1.0.0/16, IPv6 a random
// interface id in fd00:10:1::/64; distinct per pod.
func randomAddresses(e *registry.Export) {
	r := rand.New(rand.NewPCG(1, 2))
	moved := map[string]string{}
	taken := map[string]bool{}
	for i, ep := range e.Endpoints {
		to, ok := moved[ep.IP]
		for !ok {
			a := netip.MustParseAddr(ep.IP)
			if a.Is4() {
				to = netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(256)), byte(r.IntN(256))}).String()
			} else {
				b := a.As16()
				for j := 8; j < 16; j++ {
					b[j] = byte(r.IntN(256))
				}
				to = netip.AddrFrom16(b).String()
			}
			if !taken[to] {
				taken[to], moved[ep.IP], ok = true, to, true
			}
		}
		e.Endpoints[i].IP = to
	}
}

func thousands(n int) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%d,%03d", n/1000, n%1000)
}
