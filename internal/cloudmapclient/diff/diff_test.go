package diff

import (
	"maps"
	"slices"
	"testing"
)

func TestInstances(t *testing.T) {
	type attrs = map[string]string
	mine := func(a attrs) bool { return a["owner"] == "me" }
	want := map[string]attrs{
		"same":    {"owner": "me", "ip": "10.0.0.1"},
		"changed": {"owner": "me", "ip": "10.0.0.2"},
		"new":     {"owner": "me", "ip": "10.0.0.3"},
		"theirs":  {"owner": "me", "ip": "10.0.0.4"},
	}
	found := map[string]attrs{
		"same":    {"owner": "me", "ip": "10.0.0.1"},
		"changed": {"owner": "me", "ip": "10.0.0.9"},
		"theirs":  {"owner": "them", "ip": "10.0.0.4"},
		"gone":    {"owner": "me", "ip": "10.0.0.5"},
		"other":   {"owner": "them", "ip": "10.0.0.6"},
	}
	c := Instances(want, found, mine, maps.Equal)
	if got := slices.Sorted(maps.Keys(c.Register)); !slices.Equal(got, []string{"changed", "new"}) {
		t.Errorf("register %v: want the changed and the new, never another writer's instance", got)
	}
	if !slices.Equal(c.Deregister, []string{"gone"}) {
		t.Errorf("deregister %v: want only the writer's own instance no longer wanted", c.Deregister)
	}
	// Without ownership rules every instance found is the writer's; same
	// decides what counts as a change.
	ipOnly := func(a, b attrs) bool { return a["ip"] == b["ip"] }
	c = Instances(want, found, nil, ipOnly)
	if got := slices.Sorted(maps.Keys(c.Register)); !slices.Equal(got, []string{"changed", "new"}) {
		t.Errorf("register %v: an owner attribute outside same changes nothing", got)
	}
	if !slices.Equal(c.Deregister, []string{"gone", "other"}) {
		t.Errorf("deregister %v", c.Deregister)
	}
	if !Instances(want, want, mine, maps.Equal).Empty() {
		t.Error("what is there changes nothing")
	}
}
