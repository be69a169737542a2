package hub

import (
	"testing"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
)

// An export goes into chunks and comes back whole; a chunk of another
// write, or one missing, makes the read wait rather than take half.
func TestChunksRoundTrip(t *testing.T) {
	e := registrytest.Export("set", "c1", 600) // 2,400 endpoints: 3 chunks
	objs, err := chunks("ns", e)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 3 || objs[0].Name != "shop.cart.c1.0" || objs[2].Spec.Chunks != 3 {
		t.Fatalf("%d chunks, first %s", len(objs), objs[0].Name)
	}
	for _, o := range objs[1:] {
		if o.Spec.Ports != nil || o.Spec.Revision != objs[0].Spec.Revision {
			t.Errorf("chunk %d: ports %v, revision %s of %s", o.Spec.Chunk, o.Spec.Ports, o.Spec.Revision, objs[0].Spec.Revision)
		}
	}
	got, ok := assemble("set", objs)
	if !ok || len(got.Endpoints) != len(e.Endpoints) || got.Cluster != "c1" || !got.Created.Equal(e.Created) || len(got.Ports) != 2 {
		t.Fatalf("assembled %v (%v)", got, ok)
	}
	again, _ := chunks("ns", e)
	if again[1].Spec.Revision != objs[1].Spec.Revision {
		t.Error("one export, two revisions: every publish would rewrite it")
	}

	changed, _ := chunks("ns", registrytest.Export("set", "c1", 599))
	if _, ok := assemble("set", []*hubv1alpha1.ClusterExport{changed[0], objs[1], objs[2]}); ok {
		t.Error("a head of one write and chunks of another assembled")
	}
	if _, ok := assemble("set", objs[:2]); ok {
		t.Error("an export missing a chunk assembled")
	}
	if _, ok := assemble("set", objs[1:]); ok {
		t.Error("an export without its head assembled")
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
