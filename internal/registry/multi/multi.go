// Package multi composes registries: a clusterset across Regions publishes
// to its home Region's registry and watches every Region's. One Region
// failing, throttling or out of reach keeps what it last said and holds no
// other Region up.
package multi

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Source is one registry the clusterset reads, named (a Region).
type Source struct {
	Name     string
	Registry registry.Registry
}

// Registry publishes to Home and watches every source (Home among them).
type Registry struct {
	Home    registry.Registry
	Sources []Source

	mu     sync.Mutex
	parts  map[registry.Key]map[string][]registry.Export // what each source last said of a service
	synced map[string]bool
	// unreadable are the sources whose last read of a service failed.
	unreadable map[registry.Key]map[string]bool
}

var _ registry.Registry = (*Registry)(nil)

func (m *Registry) Publish(ctx context.Context, e registry.Export) error {
	return m.Home.Publish(ctx, e)
}

func (m *Registry) Withdraw(ctx context.Context, key registry.Key) error {
	return m.Home.Withdraw(ctx, key)
}

// Check asks every source to read the service.
func (m *Registry) Check(key registry.Key) {
	for _, s := range m.Sources {
		s.Registry.Check(key)
	}
}

// Watch runs every source's Watch until ctx ends; sink hears, for each
// service, the exports of every source together.
func (m *Registry) Watch(ctx context.Context, sink registry.Sink) error {
	m.mu.Lock()
	m.parts, m.synced, m.unreadable = map[registry.Key]map[string][]registry.Export{}, map[string]bool{}, map[registry.Key]map[string]bool{}
	m.mu.Unlock()
	errs := make(chan error, len(m.Sources))
	for _, s := range m.Sources {
		go func() { errs <- s.Registry.Watch(ctx, &part{m: m, name: s.Name, sink: sink}) }()
	}
	var all []error
	for range m.Sources {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// part is one source's view into the composed sink.
type part struct {
	m    *Registry
	name string
	sink registry.Sink
}

// Set keeps this source's exports of the service and tells the sink the
// union of every source's latest: a source that cannot read a service
// adds what it last read. A union that is empty while another source
// cannot read the service is no knowledge of its absence: the sink hears
// it is unreadable (one Region's "not here" must not remove what a Region
// unread since a restart may hold).
func (p *part) Set(key registry.Key, exports []registry.Export) {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	delete(p.m.unreadable[key], p.name)
	if len(p.m.unreadable[key]) == 0 {
		delete(p.m.unreadable, key)
	}
	bySource := p.m.parts[key]
	if bySource == nil {
		bySource = map[string][]registry.Export{}
		p.m.parts[key] = bySource
	}
	if len(exports) == 0 {
		delete(bySource, p.name)
	} else {
		bySource[p.name] = inRegion(exports, p.name)
	}
	var union []registry.Export
	for _, name := range sortedNames(bySource) {
		union = append(union, bySource[name]...)
	}
	if len(bySource) == 0 {
		delete(p.m.parts, key)
	}
	if len(union) == 0 && len(p.m.unreadable[key]) > 0 {
		p.sink.Unreadable(key)
		return
	}
	p.sink.Set(key, union)
}

// Unreadable passes on: the service's imports stay as they are until a
// source reads it again.
func (p *part) Unreadable(key registry.Key) {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if p.m.unreadable[key] == nil {
		p.m.unreadable[key] = map[string]bool{}
	}
	p.m.unreadable[key][p.name] = true
	p.sink.Unreadable(key)
}

// Synced passes on once every source synced: until then a service no
// source has mentioned may still be exported in a Region not read yet.
func (p *part) Synced() {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	p.m.synced[p.name] = true
	if len(p.m.synced) == len(p.m.Sources) {
		p.sink.Synced()
	}
}

func sortedNames(m map[string][]registry.Export) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// inRegion says of exports a source read without a Region that they are
// the source's (Cloud Map's say it already).
func inRegion(exports []registry.Export, region string) []registry.Export {
	out := exports
	for i, e := range exports {
		if e.Region == "" {
			if &out[0] == &exports[0] {
				out = slices.Clone(exports)
			}
			out[i].Region = region
		}
	}
	return out
}
