package imports

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

func exportWith(cluster string, typ mcsv1beta1.ServiceImportType, ips ...string) registry.Export {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	e := registry.Export{Cluster: cluster, Type: typ, Ports: []mcsv1beta1.ServicePort{http}, Created: time.Unix(1, 0),
		IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}}
	for i, ip := range ips {
		e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ip, Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP,
			Ready: i%2 == 0, Hostname: fmt.Sprintf("h%d", i), ServicePort: http})
	}
	return e
}

func TestPlanSlices(t *testing.T) {
	key := registry.Key{Namespace: "ns", Name: "web"}
	var v4 []string
	for i := 0; i < 250; i++ {
		v4 = append(v4, fmt.Sprintf("10.0.%d.%d", i/200, i%200))
	}
	d := Plan(key, merge.Merge([]registry.Export{
		exportWith("c1", mcsv1beta1.ClusterSetIP, v4...),
		exportWith("c2", mcsv1beta1.ClusterSetIP, "fd00::1", "fd00::2"),
	}), nil)
	if d.Service == nil || d.Service.Name != DerivedName("web") || d.Service.Spec.Selector != nil ||
		*d.Service.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack || d.Service.Spec.Ports[0].Port != 80 {
		t.Fatalf("derived Service: %+v", d.Service)
	}
	count := map[string]int{}
	names := map[string]bool{}
	for _, s := range d.Slices {
		if len(s.Endpoints) > MaxEndpointsPerSlice {
			t.Errorf("%s has %d endpoints", s.Name, len(s.Endpoints))
		}
		if names[s.Name] {
			t.Errorf("two slices named %s", s.Name)
		}
		names[s.Name] = true
		src := s.Labels[mcsv1beta1.LabelSourceCluster]
		count[src+"/"+string(s.AddressType)] += len(s.Endpoints)
		if s.Labels[discoveryv1.LabelManagedBy] != ManagedBy || s.Labels[discoveryv1.LabelServiceName] != d.Service.Name || s.Labels[mcsv1beta1.LabelServiceName] != "web" {
			t.Errorf("labels %v", s.Labels)
		}
		for _, e := range s.Endpoints {
			if e.Hostname != nil {
				t.Errorf("a ClusterSetIP import keeps no hostnames")
			}
		}
	}
	if count["c1/IPv4"] != 250 || count["c2/IPv6"] != 2 || len(d.Slices) != 4 {
		t.Errorf("endpoints by cluster and family %v in %d slices", count, len(d.Slices))
	}
	if d.Import.Status.Clusters[0].Cluster != "c1" || d.Import.Status.Clusters[1].Cluster != "c2" {
		t.Errorf("status.clusters %+v", d.Import.Status.Clusters)
	}
	if d.Import.Status.EndpointSliceObjects != mcsv1beta1.EndpointSliceObjectsPresent {
		t.Errorf("status.endpointSliceObjects %q, want Present", d.Import.Status.EndpointSliceObjects)
	}
	// Stable names: planning again gives the same slices.
	again := Plan(key, merge.Merge([]registry.Export{exportWith("c1", mcsv1beta1.ClusterSetIP, v4...), exportWith("c2", mcsv1beta1.ClusterSetIP, "fd00::1", "fd00::2")}), nil)
	for i := range d.Slices {
		if d.Slices[i].Name != again.Slices[i].Name {
			t.Errorf("slice names are not stable: %s, %s", d.Slices[i].Name, again.Slices[i].Name)
		}
	}
}

func TestPlanHeadless(t *testing.T) {
	d := Plan(registry.Key{Namespace: "ns", Name: "db"}, merge.Merge([]registry.Export{exportWith("c1", mcsv1beta1.Headless, "10.0.0.1", "10.0.0.2")}), nil)
	if d.Service != nil {
		t.Errorf("a headless import has no derived Service")
	}
	s := d.Slices[0]
	if _, routed := s.Labels[discoveryv1.LabelServiceName]; routed {
		t.Errorf("headless slices are not routed by kube-proxy: %v", s.Labels)
	}
	if *s.Endpoints[0].Hostname != "h0" || *s.Endpoints[0].Conditions.Ready != true || *s.Endpoints[1].Conditions.Ready != false {
		t.Errorf("endpoints %+v", s.Endpoints)
	}
}

func TestDerivedNameIsALabel(t *testing.T) {
	long := "a-very-long-service-name-that-goes-on-and-on-and-on-for-sixty-three"
	for _, n := range []string{"web", long[:63]} {
		d := DerivedName(n)
		if len(d) > 63 || d == n {
			t.Errorf("DerivedName(%q) = %q", n, d)
		}
	}
}

// A port defined otherwise in a younger export (same name, another
// number) loses: the import's port leads only to the clusters defining it
// as the import does.
func TestPlanLeavesOutAPortThatLostItsConflict(t *testing.T) {
	key := registry.Key{Namespace: "ns", Name: "web"}
	older := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	younger := exportWith("c2", mcsv1beta1.ClusterSetIP, "10.1.0.1")
	younger.Created = time.Unix(2, 0)
	other := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 81}
	younger.Ports = []mcsv1beta1.ServicePort{other}
	younger.Endpoints[0].ServicePort = other
	d := Plan(key, merge.Merge([]registry.Export{older, younger}), nil)
	if len(d.Service.Spec.Ports) != 1 || d.Service.Spec.Ports[0].Port != 80 {
		t.Fatalf("derived ports %+v, want the older export's 80", d.Service.Spec.Ports)
	}
	for _, s := range d.Slices {
		src := s.Labels[mcsv1beta1.LabelSourceCluster]
		if src == "c2" && len(s.Ports) != 0 {
			t.Errorf("c2's slice carries ports %+v of a definition the import does not have", s.Ports)
		}
		if src == "c1" && (len(s.Ports) != 1 || *s.Ports[0].Port != 8080) {
			t.Errorf("c1's slice ports %+v", s.Ports)
		}
	}
}

// Clusters each exporting one port, one of them unnamed: the derived
// Service has two ports, so each has a name (the API refuses it
// otherwise), and the unnamed one's EndpointSlice port goes by the same
// name (kube-proxy pairs them by name).
func TestPlanNamesAnUnnamedPortAmongSeveral(t *testing.T) {
	key := registry.Key{Namespace: "ns", Name: "web"}
	named := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	unnamed := exportWith("c2", mcsv1beta1.ClusterSetIP, "10.1.0.1")
	p := mcsv1beta1.ServicePort{Protocol: corev1.ProtocolTCP, Port: 81}
	unnamed.Ports = []mcsv1beta1.ServicePort{p}
	unnamed.Endpoints[0].ServicePort, unnamed.Endpoints[0].PortName = p, ""
	d := Plan(key, merge.Merge([]registry.Export{named, unnamed}), nil)
	names := map[int32]string{}
	for _, sp := range d.Service.Spec.Ports {
		names[sp.Port] = sp.Name
	}
	if names[80] != "http" || names[81] != "tcp-81" {
		t.Fatalf("derived ports %+v, want http and tcp-81", d.Service.Spec.Ports)
	}
	for _, s := range d.Slices {
		if s.Labels[mcsv1beta1.LabelSourceCluster] == "c2" && (len(s.Ports) != 1 || *s.Ports[0].Name != "tcp-81") {
			t.Errorf("c2's slice ports %+v, want the derived Service's tcp-81", s.Ports)
		}
	}
	// Alone, an unnamed port stays unnamed, as its Service had it.
	alone := Plan(key, merge.Merge([]registry.Export{unnamed}), nil)
	if alone.Service.Spec.Ports[0].Name != "" || *alone.Slices[0].Ports[0].Name != "" {
		t.Errorf("a lone unnamed port was named: %+v", alone.Service.Spec.Ports)
	}
}

// A write narrows when it takes traffic from an endpoint: the address gone,
// neither ready nor serving while terminating (what kube-proxy routes to),
// or hinted for fewer zones.
func TestNarrows(t *testing.T) {
	ep := func(addr string, ready, terminating bool, zones ...string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready || terminating), Terminating: ptr.To(terminating)}}
		if zones != nil {
			e.Hints = &discoveryv1.EndpointHints{}
			for _, z := range zones {
				e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		return e
	}
	a, b := "10.0.0.1", "10.0.0.2"
	for _, c := range []struct {
		name     string
		from, to []discoveryv1.Endpoint
		want     bool
	}{
		{"same", []discoveryv1.Endpoint{ep(a, true, false)}, []discoveryv1.Endpoint{ep(a, true, false)}, false},
		{"added", []discoveryv1.Endpoint{ep(a, true, false)}, []discoveryv1.Endpoint{ep(a, true, false), ep(b, true, false)}, false},
		{"removed", []discoveryv1.Endpoint{ep(a, true, false), ep(b, true, false)}, []discoveryv1.Endpoint{ep(a, true, false)}, true},
		{"unready", []discoveryv1.Endpoint{ep(a, true, false)}, []discoveryv1.Endpoint{ep(a, false, false)}, true},
		{"terminating, still serving", []discoveryv1.Endpoint{ep(a, true, false)}, []discoveryv1.Endpoint{ep(a, false, true)}, false},
		{"turned ready", []discoveryv1.Endpoint{ep(a, false, false)}, []discoveryv1.Endpoint{ep(a, true, false)}, false},
		{"unready one removed", []discoveryv1.Endpoint{ep(a, false, false)}, nil, false},
		{"hinted away", []discoveryv1.Endpoint{ep(a, true, false, "z1", "z2")}, []discoveryv1.Endpoint{ep(a, true, false, locality.Nowhere)}, true},
		{"hinted here from nowhere", []discoveryv1.Endpoint{ep(a, true, false, locality.Nowhere)}, []discoveryv1.Endpoint{ep(a, true, false, "z1")}, false},
		{"hinted for fewer", []discoveryv1.Endpoint{ep(a, true, false)}, []discoveryv1.Endpoint{ep(a, true, false, "z1")}, true},
		{"hinted for more", []discoveryv1.Endpoint{ep(a, true, false, "z1")}, []discoveryv1.Endpoint{ep(a, true, false, "z1", "z2")}, false},
		{"hints dropped", []discoveryv1.Endpoint{ep(a, true, false, "z1")}, []discoveryv1.Endpoint{ep(a, true, false)}, false},
	} {
		if got := narrows(c.from, c.to); got != c.want {
			t.Errorf("%s: narrows %v, want %v", c.name, got, c.want)
		}
	}
}

// Merged ports are held to the API server's rules before the derived
// Service is written: what merging and naming make of two clusters' one
// unnamed port each passes, a name given twice or a port number given
// twice for a protocol does not.
func TestCheckPorts(t *testing.T) {
	key := registry.Key{Namespace: "ns", Name: "web"}
	one := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	two := exportWith("c2", mcsv1beta1.ClusterSetIP, "10.0.0.2")
	one.Ports = []mcsv1beta1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}}
	two.Ports = []mcsv1beta1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 8080}}
	d := Plan(key, merge.Merge([]registry.Export{one, two}), nil)
	if err := checkPorts(d.Service); err != nil || len(d.Service.Spec.Ports) != 2 {
		t.Fatalf("two clusters' unnamed ports: %v (%+v)", err, d.Service.Spec.Ports)
	}
	for _, ports := range [][]corev1.ServicePort{
		{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "http", Protocol: corev1.ProtocolTCP, Port: 81}},
		{{Name: "a", Protocol: corev1.ProtocolTCP, Port: 80}, {Name: "b", Protocol: corev1.ProtocolTCP, Port: 80}},
		{{Name: "a", Protocol: corev1.ProtocolTCP, Port: 80}, {Protocol: corev1.ProtocolTCP, Port: 81}},
		{{Name: "Not_A-Name", Protocol: corev1.ProtocolTCP, Port: 80}},
	} {
		svc := &corev1.Service{Spec: corev1.ServiceSpec{Ports: ports}}
		if err := checkPorts(svc); err == nil {
			t.Errorf("ports %+v passed", ports)
		}
	}
}
