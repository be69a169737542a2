package clusterid

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		id   Identity
		want string // "" for valid
	}{
		{Identity{"cluster-1", "set"}, ""},
		{Identity{"", "set"}, "not a valid DNS label"},
		{Identity{"Cluster_1", "set"}, "not a valid DNS label"},
		{Identity{strings.Repeat("a", 64), "set"}, "not a valid DNS label"},
		{Identity{"c1", ""}, "not a valid clusterset id"},
		{Identity{"c1", "my set"}, "not a valid clusterset id"},
	}
	for _, c := range cases {
		err := Validate(c.id)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", c.id, err, c.want)
		}
	}
}
