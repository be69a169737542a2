// Package diff compares the instances a writer wants in a Cloud Map
// service with those found there: pure, so that the record format and the
// DNS mode's plan share it without the SDK.
package diff

import (
	"slices"
)

// Changes is what one writer changes in one Cloud Map service: instances
// to register (new, or holding other attributes), by id, and ids to
// deregister.
type Changes struct {
	Register   map[string]map[string]string
	Deregister []string
}

// Empty says the changes change nothing.
func (c Changes) Empty() bool { return len(c.Register) == 0 && len(c.Deregister) == 0 }

// Instances compares the instances a writer wants in a service with those found
// there, by id. The writer's rules decide: ours says which found instances
// it may replace or remove (another's, even under an id it wants, is never
// touched; nil: every one found is its own), and same whether a found
// instance already holds what it wants.
func Instances(want, found map[string]map[string]string, ours func(attrs map[string]string) bool, same func(want, found map[string]string) bool) Changes {
	mine := func(attrs map[string]string) bool { return ours == nil || ours(attrs) }
	c := Changes{Register: map[string]map[string]string{}}
	for id, attrs := range want {
		have, ok := found[id]
		if ok && !mine(have) {
			continue
		}
		if !ok || !same(attrs, have) {
			c.Register[id] = attrs
		}
	}
	for id, attrs := range found {
		if _, ok := want[id]; !ok && mine(attrs) {
			c.Deregister = append(c.Deregister, id)
		}
	}
	slices.Sort(c.Deregister)
	return c
}
