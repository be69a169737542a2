package recordfmt

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
)

// perEndpoint is what decoding may allocate per endpoint read: its record
// (about 200 bytes) and its entry's port, the slices' growth, sorting.
// Unbounded, the chunks below allocated hundreds of MiB.
const perEndpoint = 1024

// allocated is the least that decode allocated over a few runs (other
// goroutines of the process allocating meanwhile only add to one run).
func allocated(decode func()) uint64 {
	least := uint64(1 << 63)
	for range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		decode()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// A packed record is bounded in what it decodes to, not only in bytes: a
// chunk of a few hundred characters that names one port 262,000 times
// (it decoded to as many endpoints, 383 MiB, before) is refused within a
// small fixed allocation; one whose addresses each name many distinct
// ports is read up to the cap and no further.
func TestPackedDecodeIsBoundedInObjects(t *testing.T) {
	bomb, wide := recordfmttest.HostileChunks()
	if len(bomb) > 500 {
		t.Fatalf("the bomb is %d characters; the review's fits in 400", len(bomb))
	}
	chunk := func(payload string) []Instance {
		a := Attrs{AttrClusterID: "c1", AttrClusterSetID: "set", AttrRecord: chunkRecord}
		if len(payload) > room(a) {
			t.Fatalf("a %d-character chunk does not fit an instance", len(payload))
		}
		splitParts(a, payload)
		return []Instance{{ID: ChunkID("set", "c1", 1), Attrs: a}}
	}
	key := registry.Key{Namespace: "ns", Name: "web"}
	var got []registry.Export
	var refused []registry.InvalidRecord
	if b := allocated(func() { got, refused = DecodeAt(key, chunk(bomb), time.Now(), registry.DefaultMaxImportEndpoints) }); b > 2<<20 {
		t.Errorf("a %d-character chunk allocated %d KiB to decode; want under 2 MiB", len(bomb), b>>10)
	}
	if len(got) != 0 || len(refused) != 1 {
		t.Fatalf("the bomb decoded to %+v, refused %+v; want no export (a chunk that does not read makes none) and the chunk refused", got, refused)
	}
	t.Logf("refused: %s", refused[0].Reason)

	// 500 addresses of 100 distinct ports each: 50,000 endpoints in one
	// instance, read up to the cap.
	const most = 5_000
	var exports []registry.Export
	b := allocated(func() { exports, _ = DecodeAt(key, chunk(wide), time.Now(), most) })
	if len(exports) != 1 || len(exports[0].Endpoints) > most || exports[0].Capped != most {
		t.Fatalf("a chunk of 50,000 endpoints under a cap of %d: %d endpoints, capped %d", most, len(exports[0].Endpoints), exports[0].Capped)
	}
	if limit := uint64(most*perEndpoint + 2<<20); b > limit {
		t.Errorf("decoding %d endpoints allocated %d KiB; want under %d KiB", most, b>>10, limit>>10)
	}
	t.Logf("%d endpoints of 50,000 read; %d KiB allocated", len(exports[0].Endpoints), b>>10)
}

// distinctChunks is n chunks of c1, each of the most distinct IPv4
// addresses that fit one instance with one port: about 1,700.
func distinctChunks(t testing.TB, n int) []Instance {
	base := Attrs{AttrClusterID: "c1", AttrClusterSetID: "set", AttrRecord: chunkRecord}
	per := fitting(maxChunkEntries, func(k int) bool {
		return len(recordfmttest.RawChunk(k, recordfmttest.PodAddr, func(int) []uint64 { return []uint64{0} }, 1)) <= room(base)
	})
	out := make([]Instance, n)
	for c := range n {
		a := maps.Clone(base)
		splitParts(a, recordfmttest.RawChunk(per, func(i int) netip.Addr { return recordfmttest.PodAddr(c*per + i) }, func(int) []uint64 { return []uint64{0} }, 1))
		out[c] = Instance{ID: ChunkID("set", "c1", c+1), Attrs: a}
	}
	if n*per < 1_000_000 {
		t.Fatalf("%d chunks hold %d endpoints; the review's hold 1.7 million", n, n*per)
	}
	return out
}

// A service of 1,000 chunks of distinct addresses (1.7 million valid
// endpoints: the quota's 1,000 instances, packed) is read up to the cap:
// the chunks past it are not even inflated, and the export says so.
func TestCappedServiceDecode(t *testing.T) {
	in := distinctChunks(t, 1000)
	key := registry.Key{Namespace: "ns", Name: "web"}
	var got []registry.Export
	b := allocated(func() { got = Decode(key, in) })
	if len(got) != 1 || len(got[0].Endpoints) > registry.DefaultMaxImportEndpoints || got[0].Capped != registry.DefaultMaxImportEndpoints {
		t.Fatalf("decoded %d exports, %d endpoints, capped %d", len(got), len(got[0].Endpoints), got[0].Capped)
	}
	if limit := uint64(registry.DefaultMaxImportEndpoints*perEndpoint + 16<<20); b > limit {
		t.Errorf("decoding allocated %d MiB; want under %d MiB", b>>20, limit>>20)
	}
	t.Logf("%d endpoints of 1,000 chunks read; %d MiB allocated", len(got[0].Endpoints), b>>20)
}

// BenchmarkCappedServiceDecode: reading a service of 1,000 hostile chunks
// (TestCappedServiceDecode's) takes well under a second; it fails past one.
func BenchmarkCappedServiceDecode(b *testing.B) {
	in := distinctChunks(b, 1000)
	key := registry.Key{Namespace: "ns", Name: "web"}
	start := time.Now()
	for range b.N {
		Decode(key, in)
	}
	per := time.Since(start) / time.Duration(b.N)
	fmt.Printf("1,000 chunks of 1.7 million endpoints decoded to the cap of %d in %v (target: under 1s)\n", registry.DefaultMaxImportEndpoints, per)
	if per > time.Second {
		b.Fatalf("decode took %v; target 1s", per)
	}
}

// An address that names one port twice is refused, and a writer never
// packs one so (an address seen in two EndpointSlices of a Service).
func TestPortNamedOnce(t *testing.T) {
	twice := recordfmttest.RawChunk(1, recordfmttest.PodAddr, func(int) []uint64 { return []uint64{0, 0} }, 1)
	if _, _, err := unpackChunk(twice, registry.DefaultMaxImportEndpoints); err == nil {
		t.Error("a chunk naming a port twice for one address was read")
	}
	p := port{name: "http", protocol: corev1.ProtocolTCP, number: 8080}
	es := []entry{{addr: recordfmttest.PodAddr(1), ready: true, ports: []port{p, p}}}
	got, _, err := unpackChunk(packChunk(es), registry.DefaultMaxImportEndpoints)
	if err != nil || len(got) != 1 || len(got[0].ports) != 1 {
		t.Fatalf("an address with a port listed twice packs to %+v (%v); want it once", got, err)
	}
}

// BenchmarkDecodeFleetService: one large Service as an importer of a
// 50-cluster clusterset reads it, each cluster's 2,000 pods packed, every
// pod on one of 20 nodes in one of 3 zones, with named ports: the names
// repeat, and are checked once per record (before, once per endpoint:
// 271 ms a decode here, against 107 ms). Target: a third of the 1.5 s
// poll, so that one such read leaves a watcher the rest of its poll.
func BenchmarkDecodeFleetService(b *testing.B) {
	key := registry.Key{Namespace: "ns", Name: "web"}
	var in []Instance
	for c := range 50 {
		cluster := fmt.Sprintf("cluster-%02d", c)
		http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
		e := registry.Export{ClusterSet: "set", Cluster: cluster, Key: key, Type: mcsv1beta1.ClusterSetIP,
			Ports: []mcsv1beta1.ServicePort{http}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Created: time.UnixMilli(1700000000123)}
		for i := range 2000 {
			e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: fmt.Sprintf("10.%d.%d.%d", c, i/250, i%250+1), Port: 8080, PortName: "http",
				Protocol: corev1.ProtocolTCP, Ready: true, ServicePort: http, TargetPort: "http",
				NodeName: fmt.Sprintf("node-%02d.ec2.internal", i%20), Zone: fmt.Sprintf("us-east-1%c", 'a'+i%3)})
		}
		recs, err := EncodePacked(e, "test", nil)
		if err != nil {
			b.Fatal(err)
		}
		for id, attrs := range recs {
			in = append(in, Instance{ID: id, Attrs: attrs})
		}
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if got := Decode(key, in); len(got) != 50 || len(got[0].Endpoints) != 2000 {
			b.Fatalf("decoded %d exports", len(got))
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	fmt.Printf("50 clusters x 2,000 packed endpoints decoded in %v (target: under 500ms)\n", per.Round(time.Millisecond))
	if per > 500*time.Millisecond {
		b.Fatalf("decode took %v; target 500ms", per)
	}
}

// The names remembered within a record give every endpoint the verdict a
// check of its own gives: a bad node name repeated is refused each time,
// a good one passes, and an appProtocol set but empty is refused.
func TestNamesCheckedOncePerRecordSameVerdicts(t *testing.T) {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	ep := registry.Endpoint{IP: "10.0.0.1", Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, ServicePort: http, NodeName: "node-1", Zone: "us-east-1a"}
	bad := ep
	bad.NodeName = "Node_1"
	empty := ep
	empty.ServicePort.AppProtocol = new(string)
	memo := names{}
	for i, c := range []struct {
		ep   registry.Endpoint
		fail bool
	}{{ep, false}, {bad, true}, {ep, false}, {bad, true}, {empty, true}, {empty, true}} {
		for _, n := range []names{nil, memo} {
			if err := validEndpoint(c.ep, n); (err != nil) != c.fail {
				t.Errorf("endpoint %d (memo %v): %v, want failure %v", i, n != nil, err, c.fail)
			}
		}
	}
}

// The hostile writer of recordfmttest writes this format's chunks: its
// constants are this package's (else its chunks would decode to nothing,
// and the bounds above would hold trivially).
func TestHostileWriterSpeaksTheFormat(t *testing.T) {
	if recordfmttest.PackEncoding != packEncoding || recordfmttest.FlagReady != flagReady || recordfmttest.FlagServing != flagServing {
		t.Fatal("recordfmttest's wire constants differ from the format's")
	}
	a := ChunkAttrs("set", "c1", recordfmttest.RawChunk(3, recordfmttest.PodAddr, func(int) []uint64 { return []uint64{0} }, 1))
	got := Decode(registry.Key{Namespace: "ns", Name: "svc"}, []Instance{{ID: ChunkID("set", "c1", 1), Attrs: a}})
	if len(got) != 1 || len(got[0].Endpoints) != 3 {
		t.Fatalf("a hand-made chunk of 3 entries decoded to %+v", got)
	}
}
