// Package recordfmttest holds the Services the record format's tests and
// the Cloud Map registry's share: large, dual-stack, many-port exports.
package recordfmttest

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// FleetExport is a Service of n pods, dual-stack when v6, each with the
// given ports, spread over nodes in three zones.
func FleetExport(cluster string, n int, v6 bool, ports ...mcsv1beta1.ServicePort) registry.Export {
	e := registry.Export{ClusterSet: "set", Cluster: cluster, Key: registry.Key{Namespace: "ns", Name: "big"},
		Type: mcsv1beta1.ClusterSetIP, Ports: ports, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}
	if v6 {
		e.IPFamilies = append(e.IPFamilies, corev1.IPv6Protocol)
	}
	for i := range n {
		ips := []string{netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String()}
		if v6 {
			ips = append(ips, fmt.Sprintf("fd00:10:1::%x", i+1))
		}
		for _, ip := range ips {
			for _, p := range ports {
				e.Endpoints = append(e.Endpoints, registry.Endpoint{
					IP: ip, Port: p.Port + 8000, PortName: p.Name, Protocol: p.Protocol, Ready: i%17 != 0, Serving: i%17 != 0,
					NodeName: fmt.Sprintf("ip-10-0-%d-%d.eu-west-1.compute.internal", i%40, i%7), Zone: fmt.Sprintf("euw1-az%d", i%3+1),
					ServicePort: p, TargetPort: p.Name,
				})
			}
		}
	}
	return e
}

// ThreePorts are an HTTP, a gRPC and a DNS port.
var ThreePorts = []mcsv1beta1.ServicePort{
	{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, AppProtocol: ptr.To("http")},
	{Name: "grpc", Protocol: corev1.ProtocolTCP, Port: 9090},
	{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
}
