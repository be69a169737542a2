package clusterid

import (
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Gate holds what reconcilers need once the identity is known: until then
// they export and import nothing.
type Gate struct {
	mu   sync.RWMutex
	id   Identity
	reg  registry.Registry
	open bool
}

// Open lets reconcilers work with this identity and registry.
func (g *Gate) Open(id Identity, reg registry.Registry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.id, g.reg, g.open = id, reg, true
}

// Get returns the identity and registry, ok false while closed.
func (g *Gate) Get() (Identity, registry.Registry, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.id, g.reg, g.open
}
