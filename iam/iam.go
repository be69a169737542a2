// Package iam holds the IAM policy of each mode (the JSON files beside it)
// and the table in README.md of the Cloud Map actions each mode calls with
// the extra actions AWS's API permissions reference lists for them; its
// tests hold the policies to the table, and the e2e tests hold both to the
// calls the controllers really make.
package iam

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"
)

//go:embed *.json README.md
var files embed.FS

// Modes are the modes with a policy, by file name.
var Modes = []string{"mcs", "cloudmap-dns", "mcs-shared-owner", "mcs-shared-member"}

// Policy is the part of an IAM policy document the checks read.
type Policy struct {
	Statement []Statement
}

// Statement is one statement of a policy.
type Statement struct {
	Sid       string
	Effect    string
	Action    any // a string or a list
	Condition map[string]map[string]any
}

// Actions are the statement's actions.
func (s Statement) Actions() []string {
	switch v := s.Action.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, a := range v {
			if a, ok := a.(string); ok {
				out = append(out, a)
			}
		}
		return out
	}
	return nil
}

// Load reads a mode's policy.
func Load(mode string) (Policy, error) {
	var p Policy
	raw, err := files.ReadFile(mode + ".json")
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("iam/%s.json: %w", mode, err)
	}
	return p, nil
}

// Allows tells whether an Allow statement grants the action
// ("servicediscovery:RegisterInstance", "route53:GetHealthCheck"), and the
// conditions of the statements that do.
func (p Policy) Allows(action string) (bool, []map[string]map[string]any) {
	var conds []map[string]map[string]any
	ok := false
	for _, s := range p.Statement {
		if s.Effect != "Allow" {
			continue
		}
		for _, a := range s.Actions() {
			if m, _ := path.Match(strings.ToLower(a), strings.ToLower(action)); m {
				ok = true
				conds = append(conds, s.Condition)
			}
		}
	}
	return ok, conds
}

// Row is a row of README.md's table: a Cloud Map action, the extra actions
// the reference lists for it, when they are needed, and the modes that call
// the action.
type Row struct {
	Action string   // "RegisterInstance"
	Extra  []string // "route53:GetHealthCheck"
	When   string   // "DNS namespaces", "" for always
	Modes  []string
}

// When an extra action is needed: in DNS namespaces only; or for
// resources created with tags (the modes marked on that row send them).
const (
	WhenDNS  = "DNS namespaces"
	WhenTags = "tags on creation"
)

var code = regexp.MustCompile("`([^`]+)`")

// Table reads the table of README.md, between its markers.
func Table() ([]Row, error) {
	raw, err := files.ReadFile("README.md")
	if err != nil {
		return nil, err
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- actions table -->")
	body, _, ok2 := strings.Cut(rest, "<!-- end of actions table -->")
	if !ok || !ok2 {
		return nil, fmt.Errorf("iam/README.md: the actions table markers are missing")
	}
	var header []string
	var rows []Row
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case header == nil:
			header = cells
			continue
		case strings.HasPrefix(cells[0], "---"):
			continue
		case len(cells) != len(header):
			return nil, fmt.Errorf("iam/README.md: row %q has %d cells, the header %d", line, len(cells), len(header))
		}
		r := Row{Action: strings.Trim(cells[0], "`"), When: cells[2]}
		if r.When == "-" {
			r.When = ""
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			r.Extra = append(r.Extra, m[1])
		}
		for i, mode := range header[3:] {
			if cells[3+i] == "yes" {
				r.Modes = append(r.Modes, strings.Trim(mode, "`"))
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}
