package devenv

import (
	"fmt"
)

// MaxClusters bounds N so that every cluster's CIDRs stay distinct.
const MaxClusters = 50

// ClusterSpec is what one local cluster is to be: its identity and the
// address ranges that keep it apart from its siblings.
type ClusterSpec struct {
	// ID is the cluster id (ClusterProperty cluster.clusterset.k8s.io) and
	// the name of its context in the kubeconfig.
	ID string `json:"id"`
	// KwokName is kwokctl's name for the cluster; it carries a prefix so that
	// several environments (a demo and tests) can share a machine.
	KwokName string `json:"kwokName"`
	// PodCIDR is the range kwok assigns pod IPs from.
	PodCIDR string `json:"podCIDR"`
	// ServiceCIDRs are the apiserver's service ranges, IPv4 then IPv6.
	ServiceCIDRs []string `json:"serviceCIDRs"`
	// APIServerPort is fixed when the environment has a port base, else 0
	// (kwokctl picks a free one).
	APIServerPort int `json:"apiServerPort,omitempty"`
}

// Layout computes the clusters of an environment. Cluster i (from 1) gets
// pods from 10.(100+i).0.0/16 and services from 10.(200+i).0.0/16 and
// fd00:10:(200+i)::/108, so no two clusters share an address.
func Layout(prefix string, n, portBase int) ([]ClusterSpec, error) {
	if n < 1 || n > MaxClusters {
		return nil, fmt.Errorf("--clusters must be between 1 and %d, got %d", MaxClusters, n)
	}
	if prefix == "" {
		return nil, fmt.Errorf("an environment needs a name prefix")
	}
	specs := make([]ClusterSpec, n)
	for i := 1; i <= n; i++ {
		s := ClusterSpec{
			ID:           fmt.Sprintf("cluster-%d", i),
			PodCIDR:      fmt.Sprintf("10.%d.0.0/16", 100+i),
			ServiceCIDRs: []string{fmt.Sprintf("10.%d.0.0/16", 200+i), fmt.Sprintf("fd00:10:%d::/108", 200+i)},
		}
		s.KwokName = prefix + "-" + s.ID
		if portBase > 0 {
			s.APIServerPort = portBase + i
		}
		specs[i-1] = s
	}
	return specs, nil
}
