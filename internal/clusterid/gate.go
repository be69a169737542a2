package clusterid

import (
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Gate holds what reconcilers need once the identity is known: until then
// they export and import nothing.
type Gate struct {
	mu     sync.RWMutex
	id     Identity
	reg    registry.Registry
	notify func(registry.Key)
	open   bool
}

// Open lets reconcilers work with this identity and registry; notify asks
// the registry watcher to read a service again.
func (g *Gate) Open(id Identity, reg registry.Registry, notify func(registry.Key)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.id, g.reg, g.notify, g.open = id, reg, notify, true
}

// Get returns the identity and registry, ok false while closed.
func (g *Gate) Get() (Identity, registry.Registry, func(registry.Key), bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.id, g.reg, g.notify, g.open
}
