package recordfmt

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

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

// Whatever an export holds, packing it and reading it back gives it back
// (the codec keeps any string; validation is decoding's next step), and
// any bytes where a chunk's payload goes decode or fail without a panic.
func FuzzPackedRoundTrip(f *testing.F) {
	f.Add([]byte("\x01\x0a\x00\x00\x01web-0\x00node\x00zone\x00http\x00TCP\x00\x50"))
	f.Add([]byte("\x0f\xfd\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x02\x03dns\x00UDP\x00\x00\x35"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, _, err := unpackChunk(deflate64(data), registry.DefaultMaxImportEndpoints); err == nil && len(data) == 0 {
			t.Error("an empty chunk read as valid")
		}
		var es []entry
		for len(data) > 0 && len(es) < 64 {
			e, rest := fuzzEntry(data)
			es, data = append(es, e), rest
		}
		sortEntries(es)
		got, _, err := unpackChunk(packChunk(es), registry.DefaultMaxImportEndpoints)
		if err != nil {
			t.Fatalf("packed %d entries do not read back: %v", len(es), err)
		}
		if len(es) == 0 {
			es = nil
		}
		if !reflect.DeepEqual(got, es) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, es)
		}
	})
}

// fuzzEntry takes an entry from the front of data.
func fuzzEntry(data []byte) (entry, []byte) {
	take := func(n int) []byte {
		n = min(n, len(data))
		out := data[:n]
		data = data[n:]
		return out
	}
	str := func() string {
		b := take(1)
		if len(b) == 0 {
			return ""
		}
		return string(take(int(b[0] % 24)))
	}
	f := take(1)
	var flags byte
	if len(f) > 0 {
		flags = f[0]
	}
	var e entry
	if flags&flagIPv6 != 0 {
		var a [16]byte
		copy(a[:], take(16))
		e.addr = netip.AddrFrom16(a)
	} else {
		var a [4]byte
		copy(a[:], take(4))
		e.addr = netip.AddrFrom4(a)
	}
	e.ready, e.serving, e.terminating = flags&flagReady != 0, flags&flagServing != 0, flags&flagTerminating != 0
	e.hostname, e.node, e.zone = str(), str(), str()
	n := 0
	if b := take(1); len(b) > 0 {
		n = int(b[0] % 4)
	}
	for range n {
		p := port{name: str(), protocol: corev1.Protocol(str()), targetPort: str()}
		p.servicePort.Name, p.servicePort.Protocol = str(), corev1.Protocol(str())
		if b := take(4); len(b) == 4 {
			p.number, p.servicePort.Port = int32(b[0])<<8|int32(b[1]), int32(b[2])<<8|int32(b[3])
		}
		if b := take(1); len(b) > 0 && b[0]%2 == 1 {
			ap := str()
			p.servicePort.AppProtocol = &ap
		}
		// An address names a port once (a writer packs it once).
		if !slices.ContainsFunc(e.ports, func(q port) bool { return reflect.DeepEqual(p, q) }) {
			e.ports = append(e.ports, p)
		}
	}
	return e, data
}
