package ipam

import (
	"net/netip"
	"testing"
)

func TestRangeSkipsNetworkAndBroadcast(t *testing.T) {
	for _, tc := range []struct {
		cidr        string
		first, last string
		hosts       int
	}{
		{"10.101.1.0/24", "10.101.1.1", "10.101.1.254", 254},
		{"10.101.1.7/30", "10.101.1.5", "10.101.1.6", 2}, // host bits are masked off
		{"fd00:10:101:1::/126", "fd00:10:101:1::1", "fd00:10:101:1::3", 3},
	} {
		r, err := NewRange(netip.MustParsePrefix(tc.cidr))
		if err != nil {
			t.Fatal(err)
		}
		held := map[netip.Addr]bool{}
		var got []netip.Addr
		for {
			a, err := r.Allocate(func(a netip.Addr) bool { return held[a] })
			if err != nil {
				break
			}
			held[a] = true
			got = append(got, a)
		}
		if len(got) != tc.hosts || got[0].String() != tc.first || got[len(got)-1].String() != tc.last {
			t.Errorf("%s: got %d addresses %v..%v, want %d %s..%s", tc.cidr, len(got), got[0], got[len(got)-1], tc.hosts, tc.first, tc.last)
		}
	}
}

func TestRangeTooSmall(t *testing.T) {
	if _, err := NewRange(netip.MustParsePrefix("10.0.0.0/31")); err == nil {
		t.Error("a /31 has no host addresses besides network and broadcast: want an error")
	}
}

// A freed address comes back only after the rest of the range was used.
func TestRangeNextFit(t *testing.T) {
	r, _ := NewRange(netip.MustParsePrefix("10.0.0.0/29")) // .1 .. .6
	held := map[netip.Addr]bool{}
	taken := func(a netip.Addr) bool { return held[a] }
	alloc := func() netip.Addr {
		a, err := r.Allocate(taken)
		if err != nil {
			t.Fatal(err)
		}
		held[a] = true
		return a
	}
	a1 := alloc()
	alloc()
	delete(held, a1)
	var order []string
	for range 5 {
		order = append(order, alloc().String())
	}
	want := []string{"10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.1"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("allocation order %v, want %v", order, want)
		}
	}
	if _, err := r.Allocate(taken); err == nil {
		t.Error("full range: want an error")
	}
}
