// Package migrate moves a clusterset from one registry to another (Cloud
// Map to a hub cluster, or back), one cluster at a time, losing no import.
//
// A cluster on its way writes its exports to both registries (Both), then,
// once every cluster does, to the new one only, taking its records out of
// the old one (Leaving), then leaves the old one alone. Through both
// phases it reads both: a cluster's export of a service is read from the
// new registry when that holds one, from the old one otherwise. So a
// cluster not moved yet is read from the old registry, a moving one from
// either, and a moved one from the new one.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Phase is how far a cluster is on its way.
type Phase string

const (
	// Both writes to both registries.
	Both Phase = "both"
	// Leaving writes to the new registry only and withdraws this
	// cluster's exports from the old one.
	Leaving Phase = "leaving"
)

// Registry is the new registry (To) and the old one (From) of a cluster
// on its way, in Phase.
type Registry struct {
	To, From registry.Registry
	Phase    Phase

	mu         sync.Mutex
	held       map[registry.Key][2][]registry.Export // what To [0] and From [1] last said
	unreadable map[registry.Key][2]bool
	synced     [2]bool
}

var _ registry.Registry = (*Registry)(nil)

// Region is the new registry's word on this cluster's Region, else the
// old one's (registry.Located).
func (m *Registry) Region() string {
	for _, r := range []registry.Registry{m.To, m.From} {
		if l, ok := r.(registry.Located); ok && l.Region() != "" {
			return l.Region()
		}
	}
	return ""
}

// Publish writes to the new registry, and to the old one (Both) or out of
// it (Leaving).
func (m *Registry) Publish(ctx context.Context, e registry.Export) error {
	if err := m.To.Publish(ctx, e); err != nil {
		return err
	}
	if m.Phase == Leaving {
		return old(m.From.Withdraw(ctx, e.Key))
	}
	return old(m.From.Publish(ctx, e))
}

// Withdraw takes the export out of both.
func (m *Registry) Withdraw(ctx context.Context, key registry.Key) error {
	return errors.Join(m.To.Withdraw(ctx, key), old(m.From.Withdraw(ctx, key)))
}

// old says an error is the old registry's.
func old(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("the registry the clusterset moves from: %w", err)
}

// Check asks both to read the service.
func (m *Registry) Check(key registry.Key) {
	m.To.Check(key)
	m.From.Check(key)
}

// Watch reads both until ctx ends; sink hears, for each service, each
// cluster's export from the new registry where it holds one, else from
// the old one.
func (m *Registry) Watch(ctx context.Context, sink registry.Sink) error {
	m.mu.Lock()
	m.held, m.unreadable, m.synced = map[registry.Key][2][]registry.Export{}, map[registry.Key][2]bool{}, [2]bool{}
	m.mu.Unlock()
	errs := make(chan error, 2)
	for i, r := range []registry.Registry{m.To, m.From} {
		go func() { errs <- r.Watch(ctx, &side{m: m, i: i, sink: sink}) }()
	}
	return errors.Join(<-errs, <-errs)
}

// Merge is each cluster's export from to where it holds one, else from
// from.
func Merge(to, from []registry.Export) []registry.Export {
	out := append([]registry.Export(nil), to...)
	moved := map[string]bool{}
	for _, e := range to {
		moved[e.Cluster] = true
	}
	for _, e := range from {
		if !moved[e.Cluster] {
			out = append(out, e)
		}
	}
	return out
}

// side is one registry's view into the merged sink: i is 0 for the new
// registry, 1 for the old one.
type side struct {
	m    *Registry
	i    int
	sink registry.Sink
}

func (s *side) Set(key registry.Key, exports []registry.Export) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	held := s.m.held[key]
	held[s.i] = exports
	s.m.held[key] = held
	un := s.m.unreadable[key]
	un[s.i] = false
	s.m.unreadable[key] = un
	merged := Merge(held[0], held[1])
	if len(held[0]) == 0 && len(held[1]) == 0 {
		delete(s.m.held, key)
	}
	if len(merged) == 0 && (un[0] || un[1]) {
		// One side's "exported nowhere" says nothing of what the other,
		// unread, holds.
		s.sink.Unreadable(key)
		return
	}
	if !un[0] && !un[1] {
		delete(s.m.unreadable, key)
	}
	s.sink.Set(key, merged)
}

func (s *side) Unreadable(key registry.Key) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	un := s.m.unreadable[key]
	un[s.i] = true
	s.m.unreadable[key] = un
	s.sink.Unreadable(key)
}

// Synced passes on once both synced.
func (s *side) Synced() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.synced[s.i] = true
	if s.m.synced[0] && s.m.synced[1] {
		s.sink.Synced()
	}
}
