// Package ipam gives simulated pods addresses the way a real cluster's
// network plugin does: one per IP family from their node's podCIDRs, never a
// network or broadcast address, never one another pod holds. kwok's own
// allocator is IPv4-only, starts at the network address and hands a freed
// address straight to the next pod.
package ipam

import (
	"fmt"
	"net/netip"
)

// Range hands out the addresses of one node's podCIDR of one family.
// Allocation is next-fit: a freed address comes back only after every other
// free one was used, as a real IPAM's cursor does, so a replacement pod
// never takes the address of a pod that is still being torn down elsewhere.
type Range struct {
	prefix netip.Prefix
	first  netip.Addr // the network address + 1
	last   netip.Addr // the broadcast address - 1 for IPv4, else the last
	next   netip.Addr
}

// NewRange makes a range of the host addresses of prefix.
func NewRange(prefix netip.Prefix) (*Range, error) {
	prefix = prefix.Masked()
	bits := prefix.Addr().BitLen() - prefix.Bits()
	if bits < 2 {
		return nil, fmt.Errorf("pod CIDR %s has no host addresses", prefix)
	}
	last := lastAddr(prefix)
	if prefix.Addr().Is4() {
		last = last.Prev() // broadcast
	}
	first := prefix.Addr().Next()
	return &Range{prefix: prefix, first: first, last: last, next: first}, nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	host := p.Addr().BitLen() - p.Bits()
	for i := len(b) - 1; host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Prefix is the range's CIDR.
func (r *Range) Prefix() netip.Prefix { return r.prefix }

// Contains says whether a is one of the range's host addresses.
func (r *Range) Contains(a netip.Addr) bool {
	return r.prefix.Contains(a) && a.Compare(r.first) >= 0 && a.Compare(r.last) <= 0
}

// Allocate returns the first address after the last one handed out that
// taken does not claim.
func (r *Range) Allocate(taken func(netip.Addr) bool) (netip.Addr, error) {
	a := r.next
	for {
		if !taken(a) {
			r.next = r.step(a)
			return a, nil
		}
		a = r.step(a)
		if a == r.next {
			return netip.Addr{}, fmt.Errorf("pod CIDR %s is full", r.prefix)
		}
	}
}

func (r *Range) step(a netip.Addr) netip.Addr {
	if a == r.last {
		return r.first
	}
	return a.Next()
}
