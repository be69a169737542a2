package hub

import (
	"testing"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
)

// An export goes into chunks and comes back whole; a chunk of another
// write, or one missing, makes the read wait rather than take half.
func TestChunksRoundTrip(t *testing.T) {
	e := registrytest.Export("set", "c1", 600) // 2,400 endpoints: 4 chunks at three quarters full
	objs, err := chunks("ns", e)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 4 || objs[0].Name != "shop.cart.c1.0" || objs[3].Spec.Chunks != 4 || len(objs[0].Spec.ChunkRevisions) != 3 {
		t.Fatalf("%d chunks, first %s", len(objs), objs[0].Name)
	}
	for i, o := range objs[1:] {
		if o.Spec.Ports != nil || o.Spec.Revision != objs[0].Spec.ChunkRevisions[i] || len(o.Spec.Endpoints) > hubv1alpha1.MaxChunkEndpoints {
			t.Errorf("chunk %d: ports %v, revision %s (head names %s), %d endpoints", o.Spec.Chunk, o.Spec.Ports, o.Spec.Revision, objs[0].Spec.ChunkRevisions[i], len(o.Spec.Endpoints))
		}
	}
	got, ok := assemble("set", objs)
	if !ok || len(got.Endpoints) != len(e.Endpoints) || got.Cluster != "c1" || !got.Created.Equal(e.Created) || len(got.Ports) != 2 {
		t.Fatalf("assembled %v (%v)", got, ok)
	}
	again, _ := chunks("ns", e)
	for i := range again {
		if again[i].Spec.Revision != objs[i].Spec.Revision {
			t.Errorf("one export, two revisions of chunk %d: every publish would rewrite it", i)
		}
	}

	// One address fewer changes its chunk and the head, no other.
	changed, _ := chunks("ns", registrytest.Export("set", "c1", 599))
	var rewritten []int
	for i := range changed {
		if changed[i].Spec.Revision != objs[i].Spec.Revision {
			rewritten = append(rewritten, i)
		}
	}
	if len(changed) != len(objs) || len(rewritten) != 2 || rewritten[0] != 0 {
		t.Errorf("one address fewer rewrites chunks %v of %d", rewritten, len(changed))
	}
	if _, ok := assemble("set", []*hubv1alpha1.ClusterExport{changed[0], objs[1], objs[2], objs[3]}); ok {
		t.Error("a head of one write and chunks of another assembled")
	}
	if _, ok := assemble("set", objs[:3]); ok {
		t.Error("an export missing a chunk assembled")
	}
	if _, ok := assemble("set", objs[1:]); ok {
		t.Error("an export without its head assembled")
	}
}

// The largest export the hub takes still fits: past what hashing spreads
// within MaxChunks, it is cut in order.
func TestChunksHoldTheLargestExport(t *testing.T) {
	e := registrytest.Export("set", "c1", 5000) // 20,000 endpoints
	objs, err := chunks("ns", e)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range objs {
		if len(o.Spec.Endpoints) > hubv1alpha1.MaxChunkEndpoints {
			t.Errorf("chunk %d holds %d endpoints", o.Spec.Chunk, len(o.Spec.Endpoints))
		}
		n += len(o.Spec.Endpoints)
	}
	if len(objs) != hubv1alpha1.MaxChunks || n != len(e.Endpoints) {
		t.Errorf("%d endpoints in %d chunks", n, len(objs))
	}
}

// An export past 20 chunks is refused whole, as a quota: nothing written.
func TestChunksRefuseTooLarge(t *testing.T) {
	e := registrytest.Export("set", "c1", 5001) // 20,004 endpoints
	if _, err := chunks("ns", e); err == nil {
		t.Fatal("20,004 endpoints planned")
	}
}

// A head that claims more chunks than any export may have reads nothing.
func TestAssembleBoundsChunks(t *testing.T) {
	objs, _ := chunks("ns", registrytest.Export("set", "c1", 1))
	objs[0].Spec.Chunks = 1 << 30
	if _, ok := assemble("set", objs); ok {
		t.Error("a head of 2^30 chunks assembled")
	}
}

func TestNamespace(t *testing.T) {
	if got := Namespace("prod"); got != "clusterset-prod" {
		t.Errorf("Namespace(prod) = %s", got)
	}
	if got := Namespace("Prod Set.example.com"); len(got) != len("clusterset-")+16 {
		t.Errorf("Namespace of an id that is no label = %s", got)
	}
}
