//go:build e2e

package e2e

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/clustermap/clustermap/iam"
	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/test/harness"
)

func loadPolicy(t *testing.T, mode string) iam.Policy {
	t.Helper()
	p, err := iam.Load(mode)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkPolicy holds a mode's policy, and iam/README.md's table of what
// each mode calls, to the Cloud Map operations its e2e called: each is
// allowed and in the table, no other Cloud Map action is, and creation
// and deletion are conditioned on the tags the code puts on what it
// creates. (iam's own tests hold the policies to the table's extra
// actions.)
func checkPolicy(t *testing.T, mode string, calls map[string]float64) {
	t.Helper()
	p := loadPolicy(t, mode)
	rows, err := iam.Table()
	harness.Must(t, err)
	inTable, extra := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		if slices.Contains(r.Modes, mode) {
			inTable[r.Action] = true
			for _, e := range r.Extra {
				extra[e] = true // servicediscovery:TagResource: tagged creation's, never called itself
			}
		}
	}
	for _, op := range slices.Sorted(maps.Keys(inTable)) {
		if calls[op] == 0 {
			t.Errorf("iam/README.md says the %s mode calls %s; its e2e never did", mode, op)
		}
	}
	for _, op := range slices.Sorted(maps.Keys(calls)) {
		if !inTable[op] {
			t.Errorf("iam/README.md's table lacks %s for the %s mode, which its e2e called %v times", op, mode, calls[op])
		}
		if ok, _ := p.Allows("servicediscovery:" + op); !ok {
			t.Errorf("iam/%s.json does not allow %s, which the %s e2e called %v times", mode, op, mode, calls[op])
		}
	}
	for _, s := range p.Statement {
		for _, a := range s.Actions() {
			op, isCloudMap := strings.CutPrefix(a, "servicediscovery:")
			if isCloudMap && !extra[a] && (strings.ContainsAny(op, "*?") || calls[op] == 0) {
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
		_, conds := p.Allows("servicediscovery:" + op)
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
