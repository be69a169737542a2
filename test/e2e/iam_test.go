//go:build e2e

package e2e

import (
	"encoding/json"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
)

// policy is the part of an IAM policy document these checks read.
type policy struct {
	Statement []struct {
		Sid       string
		Effect    string
		Action    any // a string or a list
		Condition map[string]map[string]any
	}
}

func loadPolicy(t *testing.T, mode string) policy {
	t.Helper()
	raw, err := os.ReadFile("../../iam/" + mode + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var p policy
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("iam/%s.json: %v", mode, err)
	}
	return p
}

func actionsOf(a any) []string {
	switch v := a.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, s := range v {
			out = append(out, s.(string))
		}
		return out
	}
	return nil
}

// allows tells whether an Allow statement grants the Cloud Map operation,
// and the statement's conditions.
func (p policy) allows(op string) (bool, []map[string]map[string]any) {
	var conds []map[string]map[string]any
	ok := false
	for _, s := range p.Statement {
		if s.Effect != "Allow" {
			continue
		}
		for _, a := range actionsOf(s.Action) {
			if m, _ := path.Match(strings.ToLower(a), strings.ToLower("servicediscovery:"+op)); m {
				ok = true
				conds = append(conds, s.Condition)
			}
		}
	}
	return ok, conds
}

// checkPolicy holds a mode's policy to the Cloud Map operations its e2e
// called: each is allowed, no other Cloud Map action is, and creation and
// deletion are conditioned on the tags the code puts on what it creates.
func checkPolicy(t *testing.T, mode string, calls map[string]float64) {
	t.Helper()
	p := loadPolicy(t, mode)
	for _, op := range slices.Sorted(maps.Keys(calls)) {
		if ok, _ := p.allows(op); !ok {
			t.Errorf("iam/%s.json does not allow %s, which the %s e2e called %v times", mode, op, mode, calls[op])
		}
	}
	for _, s := range p.Statement {
		for _, a := range actionsOf(s.Action) {
			op, isCloudMap := strings.CutPrefix(a, "servicediscovery:")
			if isCloudMap && (strings.ContainsAny(op, "*?") || calls[op] == 0) {
				t.Errorf("iam/%s.json allows %s, which the %s e2e never called", mode, a, mode)
			}
		}
	}
	// Every mode creates only with clustermap's mark; the DNS mode deletes
	// by the tag it has always set (services of versions before the mark).
	// In a namespace shared across accounts nothing takes tags: services
	// are created only in the owner's namespaces and deleted only by the
	// account that created them.
	for op := range calls {
		want := policyCondition(mode, op)
		if want == "" {
			continue
		}
		_, conds := p.allows(op)
		for _, c := range conds {
			found := false
			for _, kv := range c {
				_, found = kv[want]
				if found {
					break
				}
			}
			if !found {
				t.Errorf("iam/%s.json: %s should be conditioned on %s", mode, op, want)
			}
		}
	}
	t.Logf("iam/%s.json: the %d Cloud Map operations called: %v", mode, len(calls), slices.Sorted(maps.Keys(calls)))
}

// policyCondition is the condition key a mode's policy must put on an
// operation that creates or deletes ("" for the others).
func policyCondition(mode, op string) string {
	shared := strings.HasPrefix(mode, "mcs-shared-")
	switch {
	case shared && op == "CreateService":
		return "servicediscovery:NamespaceArn"
	case shared && op == "DeleteService":
		return "servicediscovery:ServiceCreatedByAccount"
	case strings.HasPrefix(op, "Create"):
		return "aws:RequestTag/" + cloudmapclient.TagManagedBy
	case strings.HasPrefix(op, "Delete") && mode == "cloudmap-dns":
		return "aws:ResourceTag/" + cloudmapdns.TagCreatedBy
	case strings.HasPrefix(op, "Delete"):
		return "aws:ResourceTag/" + cloudmapclient.TagManagedBy
	}
	return ""
}
