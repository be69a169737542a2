// Package export publishes this cluster's ServiceExports to the registry
// and reports on them with the Valid, Ready and Conflict conditions.
package export

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
)

// AnnotationTrafficDistribution on a ServiceExport exports this
// trafficDistribution whatever its Service says (PreferClose: every
// cluster's import routes to its own endpoints first, see docs/traffic.md).
const AnnotationTrafficDistribution = "clustermap.io/traffic-distribution"

// TrafficDistribution is what a ServiceExport's annotation asks for, if
// anything; ok is false for a value clustermap does not know.
func TrafficDistribution(se *mcsv1beta1.ServiceExport) (want *string, ok bool) {
	v, set := se.Annotations[AnnotationTrafficDistribution]
	if !set {
		return nil, true
	}
	if v != corev1.ServiceTrafficDistributionPreferClose {
		return nil, false
	}
	return &v, true
}

// Build computes the export record of a Service from its ServiceExport and
// EndpointSlices: ready and not-ready endpoints, one per address and port.
// ZoneIDs are the zone ids of the nodes that have one, by node name.
func Build(id clusterid.Identity, se *mcsv1beta1.ServiceExport, svc *corev1.Service, slices []discoveryv1.EndpointSlice, zoneIDs map[string]string) registry.Export {
	e := registry.Export{
		ClusterSet: id.ClusterSet, Cluster: id.ClusterID,
		Key:                   registry.Key{Namespace: svc.Namespace, Name: svc.Name},
		Type:                  mcsv1beta1.ClusterSetIP,
		SessionAffinity:       svc.Spec.SessionAffinity,
		SessionAffinityConfig: svc.Spec.SessionAffinityConfig,
		IPFamilies:            svc.Spec.IPFamilies,
		InternalTrafficPolicy: svc.Spec.InternalTrafficPolicy,
		TrafficDistribution:   svc.Spec.TrafficDistribution,
		Labels:                se.Spec.ExportedLabels,
		Annotations:           se.Spec.ExportedAnnotations,
		Created:               se.CreationTimestamp.Time,
	}
	if want, _ := TrafficDistribution(se); want != nil {
		e.TrafficDistribution = want
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		e.Type = mcsv1beta1.Headless
	}
	if e.SessionAffinity == corev1.ServiceAffinityNone {
		e.SessionAffinity, e.SessionAffinityConfig = "", nil
	}
	byName := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		e.Ports = append(e.Ports, mcsv1beta1.ServicePort{Name: p.Name, Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port})
		byName[p.Name] = p
	}
	type addrPort struct {
		ip   string
		port int32
		prot corev1.Protocol
	}
	seen := map[addrPort]bool{}
	for _, s := range slices {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, sp := range s.Ports {
			if sp.Port == nil {
				continue
			}
			name := ptr.Deref(sp.Name, "")
			svcPort, ok := byName[name]
			if !ok {
				continue // a slice port the Service no longer has
			}
			proto := ptr.Deref(sp.Protocol, corev1.ProtocolTCP)
			for _, ep := range s.Endpoints {
				ready := kube.EndpointReady(ep.Conditions)
				for _, ip := range ep.Addresses {
					k := addrPort{ip, *sp.Port, proto}
					if seen[k] {
						continue
					}
					seen[k] = true
					r := registry.Endpoint{
						IP: ip, Port: *sp.Port, PortName: name, Protocol: proto, Ready: ready,
						Serving: ptr.Deref(ep.Conditions.Serving, ready), Terminating: ptr.Deref(ep.Conditions.Terminating, false),
						Zone:        zoneOf(ep, zoneIDs),
						ServicePort: mcsv1beta1.ServicePort{Name: svcPort.Name, Protocol: svcPort.Protocol, AppProtocol: svcPort.AppProtocol, Port: svcPort.Port},
						TargetPort:  svcPort.TargetPort.String(),
						Hostname:    ptr.Deref(ep.Hostname, ""), NodeName: ptr.Deref(ep.NodeName, ""),
					}
					e.Endpoints = append(e.Endpoints, r)
				}
			}
		}
	}
	sort.Slice(e.Endpoints, func(i, j int) bool {
		a, b := e.Endpoints[i], e.Endpoints[j]
		if a.IP != b.IP {
			return a.IP < b.IP
		}
		return a.Port < b.Port
	})
	return e
}

// zoneOf is an endpoint's zone id where its node has one: zone names map
// to different zones in different AWS accounts.
func zoneOf(ep discoveryv1.Endpoint, zoneIDs map[string]string) string {
	if id := zoneIDs[ptr.Deref(ep.NodeName, "")]; id != "" {
		return id
	}
	return ptr.Deref(ep.Zone, "")
}
