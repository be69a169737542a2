package recordfmt

import (
	"strings"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
)

// The format follows what the registry shows of the other clusters: per
// endpoint until it was read, and while any other exporting cluster writes
// an older format or another controller's records; packed otherwise, or
// never when told so. Each new choice is heard once.
func TestFormatsChoose(t *testing.T) {
	var heard []string
	switches := 0
	f := &Formats{Cluster: "me", OnChoice: func(c Choice, switched bool) {
		heard = append(heard, c.String())
		if switched {
			switches++
		}
	}}
	sink := f.Tap(registry.SinkFuncs{})
	web, api := registry.Key{Namespace: "ns", Name: "web"}, registry.Key{Namespace: "ns", Name: "api"}
	export := func(cluster string, version int) registry.Export {
		return registry.Export{Cluster: cluster, RecordVersion: version}
	}
	step := func(what string, change func(), packed, known bool, why string) {
		t.Helper()
		change()
		c := f.Choose()
		if c.Packed != packed || c.Known != known || !strings.Contains(c.Why, why) {
			t.Errorf("%s: %s (known %v), want packed %v known %v, saying %q", what, c, c.Known, packed, known, why)
		}
	}
	step("before the first read", func() { sink.Set(web, []registry.Export{export("old", 2), export("me", 2)}) }, false, false, "not read yet")
	step("read: a cluster writes format 2", func() { sink.Synced() }, false, true, "cluster old writes record format 2")
	step("and another the AWS controller's", func() { sink.Set(api, []registry.Export{export("aws", 0), export("new", 3)}) }, false, true, "cluster aws writes another controller's records")
	step("the AWS cluster stops exporting", func() { sink.Set(api, []registry.Export{export("new", 3)}) }, false, true, "cluster old writes record format 2")
	step("the old cluster upgrades", func() { sink.Set(web, []registry.Export{export("old", 3), export("me", 2)}) }, true, true, "every other cluster that exports (2)")
	step("a newer release joins", func() { sink.Set(api, []registry.Export{export("new", 3), export("next", 4)}) }, true, true, "(3)")
	if len(heard) != 6 || switches != 2 {
		t.Errorf("heard %d choices and %d switches, want 6 (one per change of reason) and 2 (known, then packed): %q", len(heard), switches, heard)
	}
	kept := &Formats{Cluster: "me", PerEndpoint: true}
	kept.Tap(registry.SinkFuncs{}).Synced()
	if c := kept.Choose(); c.Packed || !c.Known {
		t.Errorf("told to keep per-endpoint records: %s", c)
	}
}

// A per-endpoint record that comes and goes (any member can write one)
// switches the format at most once per FormatHold: 10 flips in 5 minutes
// cost one switch, and the last state is taken once the hold is over. A
// drained cluster's records ask for nothing.
func TestFormatsHold(t *testing.T) {
	now := time.Unix(1e9, 0)
	switches := 0
	f := &Formats{Cluster: "me", Now: func() time.Time { return now }, OnChoice: func(c Choice, switched bool) {
		if switched {
			switches++
		}
	}}
	sink := f.Tap(registry.SinkFuncs{})
	web, junk := registry.Key{Namespace: "ns", Name: "web"}, registry.Key{Namespace: "ns", Name: "junk"}
	sink.Set(web, []registry.Export{{Cluster: "peer", RecordVersion: 3}})
	sink.Synced()
	if c := f.Choose(); !c.Packed {
		t.Fatalf("first choice %s, want packed", c)
	}
	switches = 0
	for i := range 10 {
		now = now.Add(25 * time.Second)
		if i%2 == 0 {
			sink.Set(junk, []registry.Export{{Cluster: "mallory", RecordVersion: 0}})
		} else {
			sink.Set(junk, nil)
		}
		f.Choose()
	}
	if c := f.Choose(); switches != 1 || c.Packed || !strings.Contains(c.Why, "switches at most once") {
		t.Errorf("10 flips in %v: %d switches, now %s; want 1, held per-endpoint", 250*time.Second, switches, c)
	}
	now = now.Add(FormatHold)
	f.mu.Lock()
	f.stale = true
	f.mu.Unlock()
	if c := f.Choose(); !c.Packed || switches != 2 {
		t.Errorf("past the hold, the record gone: %s after %d switches; want packed again", c, switches)
	}
	if f.recheck != nil {
		t.Error("a recheck is still set after the switch it waited for")
	}
	sink.Set(junk, []registry.Export{{Cluster: "mallory", RecordVersion: 0, Silent: now}})
	if c := f.Choose(); !c.Packed {
		t.Errorf("a drained cluster's old records: %s, want packed", c)
	}
}
