package cloudmap

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/clustermap/clustermap/internal/registry"
)

// Another cluster's Cloud Map records are untrusted input: whatever their
// attributes, decoding never panics, and every endpoint it yields has a
// valid address (no loopback, link-local or multicast one) and port, and
// every service property passes the validators an import's objects meet
// (the rest are reported Invalid).
func FuzzDecode(f *testing.F) {
	key := registry.Key{Namespace: "ns", Name: "svc"}
	e := registry.Export{ClusterSet: "set", Cluster: "c1", Key: key, Endpoints: []registry.Endpoint{
		{IP: "10.0.0.1", Port: 8080, PortName: "http", Protocol: "TCP", Ready: true},
		{IP: "fd00::1", Port: 53, Protocol: "UDP"},
	}}
	enc, err := Encode(e, "seed", RecordVersion)
	if err != nil {
		f.Fatal(err)
	}
	seed, _ := json.Marshal(enc)
	f.Add(seed)
	f.Add([]byte(`{"x":{"AWS_INSTANCE_IPV4":"300.1.1.1","AWS_INSTANCE_PORT":"99999"}}`))
	f.Add([]byte(`{"x":{"CLUSTERMAP_RECORD_VERSION":"999","CLUSTERMAP_PORTS":"[{]"}}`))
	f.Add([]byte(`{"x":{"AWS_INSTANCE_IPV4":"127.0.0.1","AWS_INSTANCE_PORT":"80","CLUSTER_ID":"c9","CLUSTERSET_ID":"set"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var records map[string]Attrs
		if json.Unmarshal(data, &records) != nil {
			return
		}
		var in []Instance
		for id, a := range records {
			in = append(in, Instance{ID: id, Attrs: a})
		}
		for _, x := range Decode(key, in) {
			if x.Foreign {
				// Ports derived from endpoint records: each is valid alone.
				x.Ports = nil
			}
			if err := validateRecord(&x); err != nil {
				t.Errorf("decoded export of cluster %q fails validation: %v", x.Cluster, err)
			}
			if c := x.SessionAffinityConfig; c != nil && (*c.ClientIP.TimeoutSeconds < 1 || *c.ClientIP.TimeoutSeconds > maxAffinitySeconds) {
				t.Errorf("decoded affinity timeout %d", *c.ClientIP.TimeoutSeconds)
			}
			for _, ep := range x.Endpoints {
				addr, err := netip.ParseAddr(ep.IP)
				if err != nil || specialAddress(addr) != "" {
					t.Errorf("decoded endpoint with address %q: %v %s", ep.IP, err, specialAddress(addr))
				}
				if validPortName("port", ep.PortName) != nil || validPortName("service port", ep.ServicePort.Name) != nil {
					t.Errorf("decoded endpoint with port names %q, %q", ep.PortName, ep.ServicePort.Name)
				}
				if ep.Port < 1 || ep.Port > 65535 {
					t.Errorf("decoded endpoint with port %d", ep.Port)
				}
			}
		}
	})
}
