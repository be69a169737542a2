package export

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
)

func TestBuild(t *testing.T) {
	id := clusterid.Identity{ClusterID: "c1", ClusterSet: "set"}
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"},
		Spec: mcsv1beta1.ServiceExportSpec{ExportedLabels: map[string]string{"tier": "data"}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, SessionAffinity: corev1.ServiceAffinityNone,
			Ports: []corev1.ServicePort{{Name: "sql", Protocol: corev1.ProtocolTCP, Port: 5432, TargetPort: intstr.FromString("pg")}}}}
	ep := func(ip string, ready *bool, host string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
		if host != "" {
			e.Hostname = ptr.To(host)
		}
		return e
	}
	sqlPort := []discoveryv1.EndpointPort{{Name: ptr.To("sql"), Port: ptr.To[int32](6432)}} // no protocol: TCP
	slices := []discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: sqlPort,
			Endpoints: []discoveryv1.Endpoint{ep("10.0.0.2", ptr.To(false), "db-1"), ep("10.0.0.1", nil, "db-0")}},
		// The same endpoint in a second slice (during a slice update) counts once.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: sqlPort, Endpoints: []discoveryv1.Endpoint{ep("10.0.0.1", ptr.To(true), "db-0")}},
		// A port the Service no longer has, and an FQDN slice: not exported.
		{AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("old"), Port: ptr.To[int32](1)}},
			Endpoints: []discoveryv1.Endpoint{ep("10.0.0.3", nil, "")}},
		{AddressType: discoveryv1.AddressTypeFQDN, Ports: sqlPort, Endpoints: []discoveryv1.Endpoint{ep("db.example.com", nil, "")}},
	}
	e := Build(id, se, svc, slices, nil)
	if e.Type != mcsv1beta1.Headless || e.Cluster != "c1" || e.ClusterSet != "set" || e.Labels["tier"] != "data" {
		t.Errorf("export %+v", e)
	}
	if e.SessionAffinity != "" || e.SessionAffinityConfig != nil {
		t.Errorf("affinity None should be left out: %q", e.SessionAffinity)
	}
	if len(e.Ports) != 1 || e.Ports[0].Port != 5432 {
		t.Errorf("ports %+v", e.Ports)
	}
	if len(e.Endpoints) != 2 {
		t.Fatalf("endpoints %+v, want 10.0.0.1 and 10.0.0.2", e.Endpoints)
	}
	a, b := e.Endpoints[0], e.Endpoints[1]
	if a.IP != "10.0.0.1" || !a.Ready || a.Hostname != "db-0" || a.Port != 6432 || a.Protocol != corev1.ProtocolTCP ||
		a.ServicePort.Port != 5432 || a.TargetPort != "pg" {
		t.Errorf("first endpoint %+v", a)
	}
	if b.IP != "10.0.0.2" || b.Ready || b.Hostname != "db-1" {
		t.Errorf("second endpoint %+v: not-ready endpoints are exported, as not ready", b)
	}
}

// An endpoint's zone is its node's zone id where the node has one (zone
// names differ between accounts), else its slice's zone; the ServiceExport's
// annotation exports PreferClose whatever the Service says.
func TestBuildLocality(t *testing.T) {
	id := clusterid.Identity{ClusterID: "c1", ClusterSet: "set"}
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web",
		Annotations: map[string]string{AnnotationTrafficDistribution: "PreferClose"}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	ep := func(ip, node, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node), Zone: ptr.To(zone)}
	}
	slices := []discoveryv1.EndpointSlice{{AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{ep("10.0.0.1", "n1", "us-east-1a"), ep("10.0.0.2", "n2", "us-east-1b")}}}
	e := Build(id, se, svc, slices, map[string]string{"n1": "use1-az6"})
	if e.Endpoints[0].Zone != "use1-az6" || e.Endpoints[1].Zone != "us-east-1b" {
		t.Errorf("zones %q %q, want the zone id, then the slice's zone", e.Endpoints[0].Zone, e.Endpoints[1].Zone)
	}
	if e.TrafficDistribution == nil || *e.TrafficDistribution != "PreferClose" {
		t.Errorf("trafficDistribution %v, want the annotation's", e.TrafficDistribution)
	}
	se.Annotations[AnnotationTrafficDistribution] = "Nearby"
	if _, ok := TrafficDistribution(se); ok {
		t.Error("an unknown value is accepted")
	}
	svc.Spec.TrafficDistribution = ptr.To("PreferSameZone")
	if e := Build(id, se, svc, slices, nil); e.TrafficDistribution == nil || *e.TrafficDistribution != "PreferSameZone" {
		t.Errorf("with a wrong annotation the Service's is exported: %v", e.TrafficDistribution)
	}
}
