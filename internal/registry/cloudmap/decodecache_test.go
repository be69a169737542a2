package cloudmap

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
)

// A read decodes again only the clusters whose records changed, and what
// it returns is what decoding every record returns: packed and
// per-endpoint exports, a record refused as another cluster's, one of a
// cluster with no accepted record (said on the first export), a cluster
// that goes.
func TestDecodeOnlyChangedClusters(t *testing.T) {
	now := time.Now()
	records := map[string]recordfmt.Attrs{}
	for c := range 5 {
		e := recordfmttest.FleetExport(fmt.Sprintf("c%d", c), 20+c, c == 1, recordfmttest.ThreePorts...)
		var enc map[string]recordfmt.Attrs
		var err error
		if c == 2 {
			enc, err = recordfmt.Encode(e, "test", 1)
		} else {
			enc, err = recordfmt.EncodePacked(e, "test", nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(records, enc)
	}
	// c3's service record claiming c4 (refused: the id is c3's), and a
	// record of a cluster that has no accepted one.
	forged := maps.Clone(records[recordfmt.ServiceRecordID("set", "c3")])
	forged[recordfmt.AttrClusterID] = "c4"
	records["forged"] = forged
	orphan := maps.Clone(records[recordfmt.ServiceRecordID("set", "c0")])
	orphan[recordfmt.AttrClusterID] = "nobody"
	records["orphan"] = orphan

	c := newDecodeCache(registry.DefaultMaxImportEndpoints)
	read := func(what string, wantDecodes int) {
		t.Helper()
		before := c.decodes
		instances := recordfmt.Instances(records)
		got, gotOrphans := c.decode(recordfmttest.FleetExport("x", 0, false).Key, instances, now)
		want, wantOrphans := recordfmt.DecodeAt(recordfmttest.FleetExport("x", 0, false).Key, recordfmt.Instances(records), now, registry.DefaultMaxImportEndpoints)
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("%s: cached decode differs (-full +cached):\n%s", what, d)
		}
		if d := cmp.Diff(wantOrphans, gotOrphans); d != "" {
			t.Fatalf("%s: orphans differ:\n%s", what, d)
		}
		if n := c.decodes - before; n != wantDecodes {
			t.Errorf("%s: decoded %d clusters, want %d", what, n, wantDecodes)
		}
	}
	read("first read", 6) // c0..c4 and nobody
	got, _ := c.decode(recordfmttest.FleetExport("x", 0, false).Key, recordfmt.Instances(records), now)
	if len(got) != 5 || len(got[0].Invalid) != 1 || got[0].Invalid[0].ID != "orphan" || len(got[4].Invalid) != 1 || got[4].Invalid[0].ID != "forged" {
		t.Fatalf("want c0..c4, the forged record refused on c4, the orphan on c0; got %+v", got)
	}
	read("the same records again", 0)

	// One more pod in c1: c1 alone is decoded.
	more, err := recordfmt.EncodePacked(recordfmttest.FleetExport("c1", 22, true, recordfmttest.ThreePorts...), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(records, more)
	read("c1 changed", 1)

	// c2's per-endpoint records go: c2 is gone from the decode, no
	// other cluster decoded.
	for id, a := range records {
		if a[recordfmt.AttrClusterID] == "c2" {
			delete(records, id)
		}
	}
	read("c2 gone", 0)

	// The orphan goes: no export of it, nothing decoded again.
	delete(records, "orphan")
	read("orphan gone", 0)
}
