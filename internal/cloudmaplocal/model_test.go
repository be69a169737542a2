package cloudmaplocal_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
)

// modelPath is the Cloud Map model without its documentation, extracted by
// modelgen from ../shared/spec (make generate), so a clone with nothing beside
// it checks the emulator against the same shapes.
const modelPath = "testdata/servicediscovery-model.json"

const smithyNS = "com.amazonaws.servicediscovery#"

type smithyMember struct {
	Target string         `json:"target"`
	Traits map[string]any `json:"traits"`
}

type smithyShape struct {
	Type       string                  `json:"type"`
	Members    map[string]smithyMember `json:"members"`
	Member     *smithyMember           `json:"member"`
	Key        *smithyMember           `json:"key"`
	Value      *smithyMember           `json:"value"`
	Traits     map[string]any          `json:"traits"`
	Input      *smithyMember           `json:"input"`
	Operations []smithyMember          `json:"operations"`
}

type smithyModel struct {
	Shapes map[string]smithyShape `json:"shapes"`
}

func loadModel(t *testing.T) smithyModel {
	t.Helper()
	raw, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatalf("the Cloud Map model extract must be at %s (go generate ./internal/cloudmaplocal): %v", modelPath, err)
	}
	var m smithyModel
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m smithyModel) operations() []string {
	var ops []string
	for _, s := range m.Shapes {
		for _, o := range s.Operations {
			ops = append(ops, strings.TrimPrefix(o.Target, smithyNS))
		}
	}
	sort.Strings(ops)
	return ops
}

func TestEveryModelOperationIsServed(t *testing.T) {
	m := loadModel(t)
	want, got := m.operations(), cloudmaplocal.Operations()
	if len(want) != 30 {
		t.Errorf("the model has %d operations, the spec says 30", len(want))
	}
	if strings.Join(want, ",") != strings.Join(got, ",") {
		t.Errorf("operations served:\n%v\nin the model:\n%v", got, want)
	}
}

// The committed tables must be what the generator makes of today's model.
func TestGeneratedTablesMatchModel(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gen.go")
	cmd := exec.Command("go", "run", "./modelgen", modelPath, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("modelgen: %v\n%s", err, b)
	}
	fresh, _ := os.ReadFile(out)
	committed, _ := os.ReadFile("zz_generated_model.go")
	if !bytes.Equal(fresh, committed) {
		t.Error("zz_generated_model.go is stale: run `go generate ./internal/cloudmaplocal`")
	}
}

// constraint is one way to break an input: a path to a member and the bad
// value to put there (nil: remove it).
type constraint struct {
	path []string
	bad  any
	kind string // "required", "pattern", "enum", "range", "length"
}

func (m smithyModel) shape(target string) (smithyShape, bool) {
	s, ok := m.Shapes[target]
	return s, ok
}

func traitMap(s smithyShape, name string) map[string]any {
	v, _ := s.Traits["smithy.api#"+name].(map[string]any)
	return v
}

func compile(p string) *regexp2.Regexp { return regexp2.MustCompile(p, regexp2.ECMAScript) }

func matches(p, s string) bool {
	ok, err := compile(p).MatchString(s)
	return err == nil && ok
}

func lengthOK(s smithyShape, v string) bool {
	l := traitMap(s, "length")
	if mn, ok := l["min"].(float64); ok && float64(len(v)) < mn {
		return false
	}
	if mx, ok := l["max"].(float64); ok && float64(len(v)) > mx {
		return false
	}
	return true
}

// valid builds a minimal valid value for a shape: required members only.
func (m smithyModel) valid(t *testing.T, target string) any {
	s, ok := m.shape(target)
	if !ok { // prelude
		switch target {
		case "smithy.api#Boolean", "smithy.api#PrimitiveBoolean":
			return true
		case "smithy.api#Integer", "smithy.api#Long", "smithy.api#Timestamp":
			return 1
		}
		return "a"
	}
	switch s.Type {
	case "structure":
		obj := map[string]any{}
		for name, mem := range s.Members {
			if _, req := mem.Traits["smithy.api#required"]; req {
				obj[name] = m.valid(t, mem.Target)
			}
		}
		return obj
	case "list":
		return []any{m.valid(t, s.Member.Target)}
	case "map":
		return map[string]any{m.valid(t, s.Key.Target).(string): m.valid(t, s.Value.Target)}
	case "enum":
		for name, mem := range s.Members {
			if v, ok := mem.Traits["smithy.api#enumValue"].(string); ok {
				return v
			}
			return name
		}
	case "integer", "long":
		if mn, ok := traitMap(s, "range")["min"].(float64); ok {
			return int64(mn)
		}
		return 1
	case "boolean":
		return true
	case "timestamp":
		return 1
	case "string":
		for _, c := range []string{"abc", "example.com", "a", "1"} {
			p, hasPattern := s.Traits["smithy.api#pattern"].(string)
			if lengthOK(s, c) && (!hasPattern || matches(p, c)) {
				return c
			}
		}
		t.Fatalf("no valid value known for %s", target)
	}
	t.Fatalf("unhandled shape %s (%s)", target, s.Type)
	return nil
}

// constraints lists every way to break a value of the shape, at any depth.
func (m smithyModel) constraints(t *testing.T, target string, path []string, depth int) []constraint {
	s, ok := m.shape(target)
	if !ok || depth > 6 {
		return nil
	}
	at := func(p ...string) []string { return append(append([]string{}, path...), p...) }
	var out []constraint
	switch s.Type {
	case "structure":
		names := make([]string, 0, len(s.Members))
		for n := range s.Members {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, name := range names {
			mem := s.Members[name]
			if _, req := mem.Traits["smithy.api#required"]; req {
				out = append(out, constraint{path: at(name), kind: "required"})
			}
			out = append(out, m.constraints(t, mem.Target, at(name), depth+1)...)
		}
	case "list":
		out = append(out, m.constraints(t, s.Member.Target, at("[0]"), depth+1)...)
	case "map":
		out = append(out, m.constraints(t, s.Key.Target, at("{key}"), depth+1)...)
		out = append(out, m.constraints(t, s.Value.Target, at("{value}"), depth+1)...)
	case "enum":
		out = append(out, constraint{path: path, bad: "NOT_IN_THE_ENUM", kind: "enum"})
	case "integer", "long":
		if mx, ok := traitMap(s, "range")["max"].(float64); ok {
			out = append(out, constraint{path: path, bad: int64(mx) + 1, kind: "range"})
		}
		if mn, ok := traitMap(s, "range")["min"].(float64); ok {
			out = append(out, constraint{path: path, bad: int64(mn) - 1, kind: "range"})
		}
	case "string":
		if p, ok := s.Traits["smithy.api#pattern"].(string); ok {
			found := false
			for _, c := range []string{" ", "bad value", "\u00e9", "-", "a..b", ""} {
				if lengthOK(s, c) && !matches(p, c) {
					out = append(out, constraint{path: path, bad: c, kind: "pattern"})
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("no value breaks pattern %s of %s", p, target)
			}
		}
		if mx, ok := traitMap(s, "length")["max"].(float64); ok {
			out = append(out, constraint{path: path, bad: strings.Repeat("a", int(mx)+1), kind: "length"})
		}
	}
	return out
}

// apply puts the constraint's bad value (or removes the member) in a copy
// of the valid input, building any optional parent it passes through.
func (m smithyModel) apply(t *testing.T, input string, c constraint) map[string]any {
	root := m.valid(t, smithyNS+input).(map[string]any)
	var cur any = root
	target := smithyNS + input
	for i, step := range c.path {
		last := i == len(c.path)-1
		s, _ := m.shape(target)
		switch step {
		case "[0]":
			l := cur.([]any)
			target = s.Member.Target
			if last {
				l[0] = c.bad
				return root
			}
			cur = l[0]
		case "{key}":
			mp := cur.(map[string]any)
			for k := range mp {
				delete(mp, k)
			}
			mp[c.bad.(string)] = m.valid(t, s.Value.Target)
			return root
		case "{value}":
			mp := cur.(map[string]any)
			target = s.Value.Target
			for k := range mp {
				if last {
					mp[k] = c.bad
					return root
				}
				cur = mp[k]
			}
		default:
			obj := cur.(map[string]any)
			target = s.Members[step].Target
			if last {
				if c.kind == "required" {
					delete(obj, step)
				} else {
					obj[step] = c.bad
				}
				return root
			}
			if _, ok := obj[step]; !ok {
				obj[step] = m.valid(t, target)
			}
			cur = obj[step]
		}
	}
	return root
}

func post(t *testing.T, url, op string, body any) (int, map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	req.Header.Set("X-Amz-Target", "Route53AutoNaming_v20170314."+op)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// Every required member, pattern, enum, range and maximum length of every
// operation's input, at any depth, is enforced with 400 InvalidInput.
func TestModelConstraintsAreEnforced(t *testing.T) {
	m := loadModel(t)
	_, _, url := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	counts := map[string]int{}
	for _, op := range m.operations() {
		input := strings.TrimPrefix(m.Shapes[smithyNS+op].Input.Target, smithyNS)
		// The minimal valid input passes the model's validation (it may name
		// nothing that exists, or break a rule the model does not state).
		if status, body := post(t, url, op, m.valid(t, smithyNS+input)); strings.Contains(fmt.Sprint(body["Message"]), "validation error") {
			t.Errorf("%s: a valid input was rejected (%d): %v", op, status, body["Message"])
		}
		for _, c := range m.constraints(t, smithyNS+input, nil, 0) {
			counts[c.kind]++
			status, body := post(t, url, op, m.apply(t, input, c))
			msg, _ := body["Message"].(string)
			if status != 400 || body["__type"] != "InvalidInput" || !strings.Contains(msg, "validation error") {
				t.Errorf("%s: %s constraint at %s not enforced: %d %v %s", op, c.kind, strings.Join(c.path, "."), status, body["__type"], msg)
				continue
			}
			leaf := c.path[len(c.path)-1]
			if !strings.HasPrefix(leaf, "[") && !strings.HasPrefix(leaf, "{") && !strings.Contains(msg, lowerFirst(leaf)) {
				t.Errorf("%s: the message does not name the member %s: %s", op, leaf, msg)
			}
		}
	}
	t.Logf("constraints checked: %v", counts)
	if counts["required"] == 0 || counts["pattern"] == 0 {
		t.Errorf("the walk found no required members or patterns: %v", counts)
	}
}

func lowerFirst(s string) string { return strings.ToLower(s[:1]) + s[1:] }
