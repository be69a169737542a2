package recordfmt

import (
	"maps"
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
)

// Everything an import needs survives the packed round trip, and decodes
// to what the per-endpoint format decodes to.
func TestPackedRoundTrip(t *testing.T) {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, AppProtocol: ptr.To("kubernetes.io/h2c")}
	web := sampleExport("c1")
	web.Endpoints = append(web.Endpoints,
		registry.Endpoint{IP: "10.0.0.2", Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Serving: true, Terminating: true, Zone: "use1-az1", ServicePort: http, TargetPort: "8080"},
		registry.Endpoint{IP: "10.0.0.2", Port: 5353, PortName: "dns", Protocol: corev1.ProtocolUDP, Serving: true, Terminating: true, Zone: "use1-az1", ServicePort: mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}, TargetPort: "dns"},
		registry.Endpoint{IP: "fd00::9", Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Ready: true, Serving: true, Hostname: "web-9", NodeName: "node-9", Zone: "use1-az2", ServicePort: http, TargetPort: "http"},
	)
	web.Ports[0] = http
	for i, ep := range web.Endpoints {
		if ep.ServicePort.Name == "http" {
			web.Endpoints[i].ServicePort = http // as the export's ports say
		}
	}
	for name, e := range map[string]registry.Export{
		"service with every field": web,
		"no endpoints":             {ClusterSet: "set", Cluster: "c1", Key: web.Key, Type: mcsv1beta1.ClusterSetIP, Ports: web.Ports},
		"headless":                 {ClusterSet: "set", Cluster: "c1", Key: web.Key, Type: mcsv1beta1.Headless, Ports: web.Ports, Endpoints: web.Endpoints[3:]},
		"2,000 dual-stack pods":    recordfmttest.FleetExport("c1", 2000, true, recordfmttest.ThreePorts...),
	} {
		t.Run(name, func(t *testing.T) {
			packed, err := EncodePacked(e, "clustermap test", nil)
			if err != nil {
				t.Fatal(err)
			}
			perEndpoint, err := Encode(e, "clustermap test", RecordVersion)
			if err != nil && len(e.Endpoints) < MaxInstances {
				t.Fatal(err)
			}
			got := Decode(e.Key, Instances(packed))
			if len(got) != 1 || len(got[0].Invalid) > 0 {
				t.Fatalf("decoded %d exports: %+v", len(got), got)
			}
			want := e
			want.Endpoints = canonical(e.Endpoints)
			want.RecordVersion = RecordVersion
			if !reflect.DeepEqual(got[0].Endpoints, want.Endpoints) {
				t.Fatalf("endpoints round trip:\n got %+v\nwant %+v", got[0].Endpoints, want.Endpoints)
			}
			got[0].Endpoints, want.Endpoints = nil, nil
			if diff := cmp.Diff(want, got[0]); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if err == nil {
				if old := Decode(e.Key, Instances(perEndpoint)); !reflect.DeepEqual(old[0].Endpoints, canonical(e.Endpoints)) {
					t.Errorf("the per-endpoint format decodes otherwise")
				}
			}
			t.Logf("%d endpoint records packed in %d instances", len(e.Endpoints), len(packed))
		})
	}
}

// An export's instances grow with its endpoints divided by hundreds, each
// within Cloud Map's limits per instance.
func TestPackedSize(t *testing.T) {
	for _, c := range []struct {
		pods  int
		v6    bool
		ports []mcsv1beta1.ServicePort
		max   int // instances, service record included
	}{
		{5, false, recordfmttest.ThreePorts[:1], 1},
		{180, false, recordfmttest.ThreePorts[:2], 2},
		{2000, true, recordfmttest.ThreePorts, 2 + 2*2000/200},
		{10000, true, recordfmttest.ThreePorts[:1], 2 + 2*10000/200},
	} {
		e := recordfmttest.FleetExport("c1", c.pods, c.v6, c.ports...)
		enc, err := EncodePacked(e, "clustermap test", nil)
		if err != nil {
			t.Fatal(err)
		}
		for id, a := range enc {
			if err := checkLimits(a); err != nil || len(a)+1 > maxAttrs {
				t.Errorf("%s: %d attributes: %v", id, len(a), err)
			}
		}
		t.Logf("%d pods (dual-stack %v) x %d ports: %d endpoint records in %d instances", c.pods, c.v6, len(c.ports), len(e.Endpoints), len(enc))
		if len(enc) > c.max {
			t.Errorf("%d pods x %d ports took %d instances, want at most %d", c.pods, len(c.ports), len(enc), c.max)
		}
	}
}

// A change rewrites the chunk holding the changed endpoint and nothing
// else: a pod turning unready, a pod added, a pod gone.
func TestPackedChangesTouchOneChunk(t *testing.T) {
	e := recordfmttest.FleetExport("c1", 2000, true, recordfmttest.ThreePorts...)
	current, err := EncodePacked(e, "clustermap test", nil)
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, change func(*registry.Export), wantRegister int) {
		t.Helper()
		change(&e)
		desired, err := EncodePacked(e, "clustermap test", current)
		if err != nil {
			t.Fatal(err)
		}
		c := Diff(desired, current)
		if len(c.Register) != wantRegister || len(c.Deregister) != 0 {
			t.Errorf("%s: %d instances to register, %d to deregister; want %d and 0", what, len(c.Register), len(c.Deregister), wantRegister)
		}
		if got := Decode(e.Key, Instances(desired)); !reflect.DeepEqual(got[0].Endpoints, canonical(e.Endpoints)) {
			t.Errorf("%s: the new records do not decode to the export", what)
		}
		current = desired
	}
	step("nothing", func(*registry.Export) {}, 0)
	step("a pod turns unready", func(e *registry.Export) {
		for i := range e.Endpoints {
			if e.Endpoints[i].IP == "10.1.3.3" {
				e.Endpoints[i].Ready, e.Endpoints[i].Serving = false, false
			}
		}
	}, 1)
	step("a pod goes", func(e *registry.Export) {
		var keep []registry.Endpoint
		for _, ep := range e.Endpoints {
			if ep.IP != "10.1.4.4" {
				keep = append(keep, ep)
			}
		}
		e.Endpoints = keep
	}, 1)
	step("a pod comes", func(e *registry.Export) {
		ep := e.Endpoints[0]
		ep.IP = "10.1.200.1"
		e.Endpoints = append(e.Endpoints, ep)
	}, 1)
	step("the export's labels change", func(e *registry.Export) { e.Labels = map[string]string{"team": "b"} }, 1)
}

// When churn leaves chunks half empty, a fresh packing replaces them:
// the instances follow the endpoints down.
func TestPackedChunksShrinkWithTheService(t *testing.T) {
	e := recordfmttest.FleetExport("c1", 2000, true, recordfmttest.ThreePorts...)
	current, err := EncodePacked(e, "clustermap test", nil)
	if err != nil {
		t.Fatal(err)
	}
	full := len(current)
	var keep []registry.Endpoint
	for _, ep := range e.Endpoints {
		if a := netip.MustParseAddr(ep.IP); a.Is4() && a.As4()[3]%8 == 0 || a.Is6() && a.As16()[15]%8 == 1 {
			keep = append(keep, ep)
		}
	}
	e.Endpoints = keep
	desired, err := EncodePacked(e, "clustermap test", current)
	if err != nil {
		t.Fatal(err)
	}
	if len(desired) > full/2 {
		t.Errorf("an eighth of the pods left still take %d of %d instances", len(desired), full)
	}
	if got := Decode(e.Key, Instances(desired)); !reflect.DeepEqual(got[0].Endpoints, canonical(keep)) {
		t.Error("the repacked records do not decode to the export")
	}
}

// A cluster switching formats holds both for a while: its endpoints are
// read once each.
func TestBothFormatsReadAsOne(t *testing.T) {
	e := recordfmttest.FleetExport("c1", 50, true, recordfmttest.ThreePorts[:2]...)
	old, err := Encode(e, "clustermap test", RecordVersion)
	if err != nil {
		t.Fatal(err)
	}
	packed, err := EncodePacked(e, "clustermap test", old)
	if err != nil {
		t.Fatal(err)
	}
	both := maps.Clone(old)
	maps.Copy(both, packed)
	got := Decode(e.Key, Instances(both))
	if want := canonical(e.Endpoints); len(got) != 1 || !reflect.DeepEqual(got[0].Endpoints, want) {
		t.Errorf("both formats decode to %d endpoints, want %d", len(got[0].Endpoints), len(want))
	}
}

// Packed records are another cluster's input too: a chunk under another
// cluster's id, one that does not inflate, one that inflates too far, and
// an endpoint no pod could have are each reported, and the rest read.
func TestPackedRecordsAreChecked(t *testing.T) {
	e := recordfmttest.FleetExport("c1", 3, false, recordfmttest.ThreePorts[:1]...)
	good, err := EncodePacked(e, "clustermap test", nil)
	if err != nil {
		t.Fatal(err)
	}
	chunk := func(cluster string, payload string) Attrs {
		a := Attrs{AttrClusterID: cluster, AttrClusterSetID: "set", AttrRecord: chunkRecord, AttrController: "clustermap x"}
		splitParts(a, payload)
		return a
	}
	loop := []entry{{addr: netip.MustParseAddr("127.0.0.1"), ready: true, ports: []port{{name: "http", protocol: corev1.ProtocolTCP, number: 80}}}}
	bomb := make([]byte, 4*maxUnpacked)
	in := Instances(good)
	in = append(in,
		Instance{ID: ChunkID("set", "c2", 1), Attrs: chunk("c1", packChunk(loop))},
		Instance{ID: ChunkID("set", "c1", 2), Attrs: chunk("c1", "not base64!")},
		Instance{ID: ChunkID("set", "c1", 3), Attrs: chunk("c1", deflate64(bomb))},
		Instance{ID: ChunkID("set", "c1", 4), Attrs: chunk("c1", packChunk(loop))},
	)
	got := Decode(e.Key, in)
	if len(got) != 1 || len(got[0].Endpoints) != 3 || len(got[0].Invalid) != 4 {
		t.Fatalf("decoded %+v; want c1's 3 endpoints and 4 records reported", got)
	}
	for _, inv := range got[0].Invalid {
		t.Logf("%s: %s", inv.ID, inv.Reason)
	}
}

// canonical is a copy of endpoints as decoding orders them.
func canonical(eps []registry.Endpoint) []registry.Endpoint {
	return dedupe(append([]registry.Endpoint(nil), eps...))
}

// Chunks read before their service record (both are written at once)
// still say their writer reads packed records: the format choice never
// takes such a cluster for another controller.
func TestChunksAloneSayPackedFormat(t *testing.T) {
	e := recordfmttest.FleetExport("c1", 2000, true, recordfmttest.ThreePorts...)
	enc, err := EncodePacked(e, "clustermap test", nil)
	if err != nil {
		t.Fatal(err)
	}
	delete(enc, ServiceRecordID("set", "c1"))
	got := Decode(e.Key, Instances(enc))
	if len(got) != 1 || got[0].RecordVersion < PackedVersion || len(got[0].Endpoints) != len(e.Endpoints) {
		t.Fatalf("chunks alone decode to format %d with %d endpoints", got[0].RecordVersion, len(got[0].Endpoints))
	}
}
