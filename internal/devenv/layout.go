//go:build linux

package devenv

import (
	"fmt"
	"net/netip"
)

// MaxClusters bounds N so that every cluster's CIDRs stay distinct.
const MaxClusters = 50

// MaxNodes bounds the nodes of a cluster: node n gets the n-th /22 (IPv4,
// 1,022 pods) and /64 (IPv6) of its cluster's pod ranges.
const MaxNodes = 63

// IP families of an environment's clusters.
const (
	IPv4      = "ipv4"
	IPv6      = "ipv6"
	DualStack = "dual"
)

// ClusterSpec is what one local cluster is to be: its identity and the
// address ranges that keep it apart from its siblings.
type ClusterSpec struct {
	// ID is the cluster id (ClusterProperty cluster.clusterset.k8s.io) and
	// the name of its context in the kubeconfig.
	ID string `json:"id"`
	// KwokName is kwokctl's name for the cluster; it carries a prefix so that
	// several environments (a demo and tests) can share a machine.
	KwokName string `json:"kwokName"`
	// PodCIDRs are the cluster's pod ranges, IPv4 first; each node gets its
	// own slice of each (NodePodCIDRs).
	PodCIDRs []string `json:"podCIDRs"`
	// ServiceCIDRs are the apiserver's service ranges, IPv4 first.
	ServiceCIDRs []string `json:"serviceCIDRs"`
	// APIServerPort is fixed when the environment has a port base, else 0
	// (kwokctl picks a free one).
	APIServerPort int `json:"apiServerPort,omitempty"`
	// Hub marks the hub cluster (Options.Hub): the clusterset's registry,
	// no member (no ClusterProperty, no nodes).
	Hub bool `json:"hub,omitempty"`
}

// HubSpec is the hub cluster of an environment: apiserver port PortBase
// (members take PortBase+i), ranges of its own.
func HubSpec(prefix string, portBase int) ClusterSpec {
	s := ClusterSpec{ID: "hub", KwokName: prefix + "-hub", PodCIDRs: []string{"10.99.0.0/16"}, ServiceCIDRs: []string{"10.199.0.0/16"}, Hub: true}
	if portBase > 0 {
		s.APIServerPort = portBase
	}
	return s
}

// Layout computes the clusters of an environment. Cluster i (from 1) gets
// pods from 10.(100+i).0.0/16 and fd00:10:(100+i)::/56 and services from
// 10.(200+i).0.0/16 and fd00:10:(200+i)::/108, those of the chosen
// families, so no two clusters share an address.
func Layout(prefix string, n, portBase int, family string) ([]ClusterSpec, error) {
	if n < 1 || n > MaxClusters {
		return nil, fmt.Errorf("--clusters must be between 1 and %d, got %d", MaxClusters, n)
	}
	if prefix == "" {
		return nil, fmt.Errorf("an environment needs a name prefix")
	}
	v4, v6 := family == IPv4 || family == DualStack, family == IPv6 || family == DualStack
	if !v4 && !v6 {
		return nil, fmt.Errorf("--ip-family must be %s, %s or %s, got %q", IPv4, IPv6, DualStack, family)
	}
	specs := make([]ClusterSpec, n)
	for i := 1; i <= n; i++ {
		s := ClusterSpec{ID: fmt.Sprintf("cluster-%d", i)}
		if v4 {
			s.PodCIDRs = append(s.PodCIDRs, fmt.Sprintf("10.%d.0.0/16", 100+i))
			s.ServiceCIDRs = append(s.ServiceCIDRs, fmt.Sprintf("10.%d.0.0/16", 200+i))
		}
		if v6 {
			s.PodCIDRs = append(s.PodCIDRs, fmt.Sprintf("fd00:10:%d::/56", 100+i))
			s.ServiceCIDRs = append(s.ServiceCIDRs, fmt.Sprintf("fd00:10:%d::/108", 200+i))
		}
		s.KwokName = prefix + "-" + s.ID
		if portBase > 0 {
			s.APIServerPort = portBase + i
		}
		specs[i-1] = s
	}
	return specs, nil
}

// NodePodCIDRs are node n's (1..MaxNodes) slices of the cluster's pod
// ranges, as a real cluster's node IPAM hands them out: for cluster 1, node
// n gets 10.101.(4n).0/22 and fd00:10:101:n::/64.
func (s ClusterSpec) NodePodCIDRs(n int) []string {
	var out []string
	for _, c := range s.PodCIDRs {
		p := netip.MustParsePrefix(c)
		b := p.Addr().AsSlice()
		bits := 8 // IPv6: a /64 per node
		if p.Addr().Is4() {
			bits = 6 // IPv4: a /22 per node
		}
		b[p.Bits()/8] = byte(n << (8 - bits))
		a, _ := netip.AddrFromSlice(b)
		out = append(out, netip.PrefixFrom(a, p.Bits()+bits).String())
	}
	return out
}
