package locality

import (
	"reflect"
	"testing"

	"github.com/clustermap/clustermap/internal/registry"
)

func export(cluster, region string, eps ...registry.Endpoint) registry.Export {
	return registry.Export{Cluster: cluster, Region: region, Endpoints: eps}
}

func ep(ip, zone string, ready bool) registry.Endpoint {
	return registry.Endpoint{IP: ip, Port: 80, Zone: zone, Ready: ready}
}

// Each zone of this cluster takes the nearest tier with a ready endpoint:
// this cluster, then the same zone id, then the Region, then all.
func TestPlanTiers(t *testing.T) {
	here := Here{Cluster: "c2", Region: "us-east-1", Zones: []Zone{{Name: "us-east-1a", ID: "use1-az1"}, {Name: "us-east-1b", ID: "use1-az2"}}}
	local := export("c2", "us-east-1", ep("10.2.0.1", "use1-az1", true))
	sameZone := export("c1", "us-east-1", ep("10.1.0.1", "use1-az1", true)) // another account: another zone name, same id
	otherZone := export("c3", "us-east-1", ep("10.3.0.1", "use1-az4", true))
	otherRegion := export("c4", "eu-west-1", ep("10.4.0.1", "euw1-az1", true))
	all := []registry.Export{local, sameZone, otherZone, otherRegion}
	a, b := "us-east-1a", "us-east-1b"
	for _, tc := range []struct {
		name    string
		exports []registry.Export
		want    map[Endpoint][]string
	}{
		{"local endpoints serve every zone", all, map[Endpoint][]string{
			{"c2", "10.2.0.1"}: {a, b}, {"c1", "10.1.0.1"}: {Nowhere}, {"c3", "10.3.0.1"}: {Nowhere}, {"c4", "10.4.0.1"}: {Nowhere}}},
		// Zone a has c1 in its zone id; zone b has nobody there, so it
		// takes the Region (c1 and c3), never eu-west-1.
		{"none local: the same zone id, else the Region", all[1:], map[Endpoint][]string{
			{"c1", "10.1.0.1"}: {a, b}, {"c3", "10.3.0.1"}: {b}, {"c4", "10.4.0.1"}: {Nowhere}}},
		{"only another Region", all[3:], map[Endpoint][]string{{"c4", "10.4.0.1"}: {a, b}}},
		{"a not-ready local endpoint is no endpoint", []registry.Export{export("c2", "us-east-1", ep("10.2.0.1", "use1-az1", false)), otherRegion},
			map[Endpoint][]string{{"c2", "10.2.0.1"}: {Nowhere}, {"c4", "10.4.0.1"}: {a, b}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hints(here, tc.exports); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("hints:\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// An endpoint is ready only if every port of it is.
func TestPlanAddressReadyOnlyWhenEveryPortIs(t *testing.T) {
	here := Here{Cluster: "c1", Zones: []Zone{{Name: "z"}}}
	half := export("c1", "", ep("10.1.0.1", "z", true), registry.Endpoint{IP: "10.1.0.1", Port: 81, Ready: false})
	other := export("c2", "", ep("10.2.0.1", "", true))
	got := Hints(here, []registry.Export{half, other})
	want := map[Endpoint][]string{{"c1", "10.1.0.1"}: {Nowhere}, {"c2", "10.2.0.1"}: {"z"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Zone names are matched where this cluster's nodes have no zone id, in
// this Region only: c3, in another, claims zone-b and gets no hint.
func TestPlanMatchesZoneNamesWithoutIDs(t *testing.T) {
	here := Here{Cluster: "c1", Region: "r", Zones: []Zone{{Name: "zone-a"}, {Name: "zone-b"}}}
	got := Hints(here, []registry.Export{export("c2", "r", ep("10.2.0.1", "zone-a", true)), export("c3", "x", ep("10.3.0.1", "zone-b", true))})
	want := map[Endpoint][]string{{"c2", "10.2.0.1"}: {"zone-a", "zone-b"}, {"c3", "10.3.0.1"}: {Nowhere}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// An exporter of another Region that claims every zone id (and zone
// name) of this cluster wins no zone: zone a takes its own zone id's
// exporter, zone b the Region's; a zone name claimed where zone ids are
// known counts for nothing.
func TestPlanZoneClaimsFromElsewhere(t *testing.T) {
	here := Here{Cluster: "c1", Region: "us-east-1", Zones: []Zone{{Name: "us-east-1a", ID: "use1-az1"}, {Name: "us-east-1b", ID: "use1-az2"}}}
	claimer := export("c9", "eu-west-1", ep("10.9.0.1", "use1-az1", true), ep("10.9.0.2", "use1-az2", true))
	byName := export("c8", "us-east-1", ep("10.8.0.1", "us-east-1b", true))
	near := export("c2", "us-east-1", ep("10.2.0.1", "use1-az1", true))
	got := Hints(here, []registry.Export{claimer, byName, near})
	want := map[Endpoint][]string{
		{"c9", "10.9.0.1"}: {Nowhere}, {"c9", "10.9.0.2"}: {Nowhere},
		{"c2", "10.2.0.1"}: {"us-east-1a", "us-east-1b"}, {"c8", "10.8.0.1"}: {"us-east-1b"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("hints:\n got %v\nwant %v", got, want)
	}
}

// No zone known here, or more than an endpoint's hints may name: no hints.
func TestPlanNoHints(t *testing.T) {
	exports := []registry.Export{export("c1", "", ep("10.1.0.1", "z", true))}
	if got := Hints(Here{Cluster: "c1"}, exports); got != nil {
		t.Fatalf("no zones: %v", got)
	}
	var many []Zone
	for _, n := range "abcdefghi" {
		many = append(many, Zone{Name: string(n)})
	}
	if got := Hints(Here{Cluster: "c1", Zones: many}, exports); got != nil {
		t.Fatalf("9 zones: %v", got)
	}
}

func TestZonesOf(t *testing.T) {
	got := ZonesOf([]map[string]string{
		{LabelZone: "b", LabelZoneID: "id-b"}, {LabelZone: "a"}, {LabelZone: "b"}, {}, {LabelZone: "a", LabelZoneID: "id-a"},
	})
	want := []Zone{{Name: "a", ID: "id-a"}, {Name: "b", ID: "id-b"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestAsks(t *testing.T) {
	for v, want := range map[string]bool{"PreferClose": true, "PreferSameZone": true, "PreferSameNode": false, "": false} {
		if got := Asks(&v); got != want {
			t.Errorf("Asks(%q) = %v", v, got)
		}
	}
	if Asks(nil) {
		t.Error("Asks(nil)")
	}
}
