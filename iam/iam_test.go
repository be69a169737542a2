package iam

import (
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/servicediscovery"
)

// dnsModes work in Cloud Map DNS namespaces; the others in HTTP ones only.
var dnsModes = []string{"cloudmap-dns"}

// TestPoliciesMatchTheTable holds each policy to README.md's table: its
// Cloud Map actions are exactly the mode's rows, each extra action is
// granted exactly where it applies (always; in DNS namespaces for a mode
// that works in them; never for a case clustermap never meets), and
// nothing else is granted.
func TestPoliciesMatchTheTable(t *testing.T) {
	rows, err := Table()
	if err != nil {
		t.Fatal(err)
	}
	client := reflect.TypeOf(&servicediscovery.Client{})
	for _, r := range rows {
		if _, ok := client.MethodByName(r.Action); !ok {
			t.Errorf("the table names %s, which is no Cloud Map operation", r.Action)
		}
		for _, e := range r.Extra {
			// Tagging is Cloud Map's own, an extra of tagged creation.
			if service, _, _ := strings.Cut(e, ":"); (service == "servicediscovery" && e != "servicediscovery:TagResource") || !strings.Contains(e, ":") {
				t.Errorf("%s: extra action %q should be another service's", r.Action, e)
			}
		}
	}
	for _, mode := range Modes {
		p, err := Load(mode)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{} // every action the policy must grant
		never := map[string]bool{}
		for _, r := range rows {
			if !slices.Contains(r.Modes, mode) {
				continue
			}
			want["servicediscovery:"+r.Action] = true
			for _, e := range r.Extra {
				switch {
				case r.When == "", r.When == WhenTags, r.When == WhenDNS && slices.Contains(dnsModes, mode):
					want[e] = true
				default:
					never[e] = true
				}
			}
		}
		for _, a := range slices.Sorted(maps.Keys(want)) {
			if ok, _ := p.Allows(a); !ok {
				t.Errorf("iam/%s.json does not grant %s, which the table says it needs", mode, a)
			}
		}
		for _, s := range p.Statement {
			for _, a := range s.Actions() {
				if strings.ContainsAny(a, "*?") {
					t.Errorf("iam/%s.json grants %s: name each action", mode, a)
				}
				switch {
				case want[a]:
				case never[a]:
					t.Errorf("iam/%s.json grants %s, needed only where this mode never works", mode, a)
				default:
					t.Errorf("iam/%s.json grants %s, which the table does not give this mode", mode, a)
				}
			}
		}
	}
}

// TestTableParses guards the parser: the rows the checks rely on are read.
func TestTableParses(t *testing.T) {
	rows, err := Table()
	if err != nil {
		t.Fatal(err)
	}
	var register []Row
	for _, r := range rows {
		if r.Action == "RegisterInstance" {
			register = append(register, r)
		}
	}
	if len(register) < 2 || !slices.Contains(register[0].Extra, "route53:CreateHealthCheck") || register[0].When != WhenDNS ||
		!slices.Equal(register[0].Modes, Modes) {
		t.Errorf("RegisterInstance rows %+v", register)
	}
}

// TestPoliciesNameNoPartition: every ARN a policy names, as a resource or
// in a condition, matches in every AWS partition (aws, aws-cn,
// aws-us-gov, ...).
func TestPoliciesNameNoPartition(t *testing.T) {
	for _, mode := range Modes {
		raw, err := files.ReadFile(mode + ".json")
		if err != nil {
			t.Fatal(err)
		}
		arns := regexp.MustCompile(`"arn:([^:"]*):`).FindAllStringSubmatch(string(raw), -1)
		if len(arns) == 0 {
			t.Errorf("iam/%s.json names no ARN: the check reads nothing", mode)
		}
		for _, m := range arns {
			if m[1] != "*" {
				t.Errorf("iam/%s.json names partition %q: the policy fails in the others (use arn:*:)", mode, m[1])
			}
		}
	}
}
