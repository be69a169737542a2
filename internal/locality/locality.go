// Package locality plans where an import's traffic goes when its exports
// ask for it (trafficDistribution PreferClose): this cluster's ready
// endpoints while there are any, else other clusters' in the same zone,
// else in the same Region, else anywhere. The plan is written as zone
// hints on the imported EndpointSlices, which the stock kube-proxy
// follows (iptables, nftables and IPVS alike).
package locality

import (
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/clustermap/clustermap/internal/registry"
)

// Node labels that say where a node is. The zone id names the same
// physical zone in every AWS account; zone names do not.
const (
	LabelZone   = corev1.LabelTopologyZone
	LabelZoneID = "topology.k8s.aws/zone-id"
)

// Nowhere is the zone hinted for an endpoint no zone of this cluster
// should use: kube-proxy follows hints only when every ready endpoint has
// one, and no node is in this zone.
const Nowhere = "nowhere.clustermap.io"

// MaxZones is how many zones one endpoint's hints may name (the API's
// limit); a cluster with more gets no hints, and the even spread.
const MaxZones = 8

// Zone is one zone this cluster has nodes in.
type Zone struct {
	Name string // topology.kubernetes.io/zone: what kube-proxy compares
	ID   string // topology.k8s.aws/zone-id, when the node has it
}

// Here is where this cluster is.
type Here struct {
	Cluster, Region string
	Zones           []Zone
}

// ZonesOf lists the distinct zones of nodes' labels, by name.
func ZonesOf(nodeLabels []map[string]string) []Zone {
	byName := map[string]string{}
	for _, l := range nodeLabels {
		if name := l[LabelZone]; name != "" {
			if byName[name] == "" {
				byName[name] = l[LabelZoneID]
			}
		}
	}
	out := make([]Zone, 0, len(byName))
	for name, id := range byName {
		out = append(out, Zone{Name: name, ID: id})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Asks says whether a merged import asks for local-first routing.
func Asks(trafficDistribution *string) bool {
	if trafficDistribution == nil {
		return false
	}
	switch *trafficDistribution {
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
		return true
	}
	return false
}

// Endpoint names one exported address of one cluster.
type Endpoint struct{ Cluster, IP string }

// Hints gives, for every endpoint of the exports, the zones of this cluster
// whose clients it serves (Nowhere for none). Nil means no hints: no zone
// is known here, or more than the API allows.
func Hints(here Here, exports []registry.Export) map[Endpoint][]string {
	if len(here.Zones) == 0 || len(here.Zones) > MaxZones {
		return nil
	}
	type ready struct {
		Endpoint
		zone, region string
		local        bool
	}
	var all []ready
	hints := map[Endpoint][]string{}
	for _, e := range exports {
		up := map[string]bool{}
		zone := map[string]string{}
		for _, ep := range e.Endpoints {
			r, seen := up[ep.IP]
			up[ep.IP] = (r || !seen) && ep.Ready && e.Silent.IsZero()
			zone[ep.IP] = ep.Zone
		}
		for ip, r := range up {
			k := Endpoint{Cluster: e.Cluster, IP: ip}
			hints[k] = nil
			if r {
				all = append(all, ready{Endpoint: k, zone: zone[ip], region: e.Region, local: e.Cluster == here.Cluster})
			}
		}
	}
	// Each zone takes the nearest tier that has a ready endpoint.
	tiers := []func(r ready, z Zone) bool{
		func(r ready, _ Zone) bool { return r.local },
		func(r ready, z Zone) bool { return r.region == here.Region && sameZone(r.zone, z) },
		func(r ready, _ Zone) bool { return r.region == here.Region },
		func(ready, Zone) bool { return true },
	}
	for _, z := range here.Zones {
		for _, in := range tiers {
			var chosen []Endpoint
			for _, r := range all {
				if in(r, z) {
					chosen = append(chosen, r.Endpoint)
				}
			}
			if len(chosen) == 0 {
				continue
			}
			for _, k := range chosen {
				hints[k] = append(hints[k], z.Name)
			}
			break
		}
	}
	for k, zs := range hints {
		if len(zs) == 0 {
			hints[k] = []string{Nowhere}
		}
	}
	return hints
}

// sameZone: a record's zone is this zone when it says its zone id, or,
// where this cluster's nodes carry no zone id (outside AWS), its name.
// Names alone are never compared where ids are known: us-east-1a is
// another physical zone in another account. A zone is a Region's, so the
// zone tier takes only exporters of this Region, whatever they claim.
func sameZone(zone string, z Zone) bool {
	if z.ID != "" {
		return zone == z.ID
	}
	return zone != "" && zone == z.Name
}

// Used says whether an endpoint hinted as Plan does serves some zone of
// this cluster (for answers that cannot see a client's zone, as DNS's).
func Used(hints []string) bool {
	for _, z := range hints {
		if z != Nowhere {
			return true
		}
	}
	return false
}
