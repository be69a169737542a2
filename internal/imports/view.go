package imports

import (
	"slices"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/registry"
)

// View is what this cluster knows of the clusterset's exports, changed
// only on positive knowledge from the registry. Each change queues the
// service's import.
type View struct {
	mu      sync.RWMutex
	exports map[registry.Key][]registry.Export
	// unreadable are services whose last read failed: their imports stay
	// as they are.
	unreadable map[registry.Key]bool
	// heard are the services the registry told of since the view was
	// made; witnessed those it told exports of. A service imported here
	// that the registry says is exported nowhere, never witnessed exported
	// since a restart, is gone only by the registry's word at start: a
	// wrong Region or account says so of everything.
	heard, witnessed map[registry.Key]bool
	events           chan event.GenericEvent
	// synced is set once the whole registry was read: before that an
	// empty view means "not read yet", not "exported nowhere".
	synced atomic.Bool
}

var _ registry.Sink = (*View)(nil)

// Synced says the view now holds every service of the registry.
func (v *View) Synced() { v.synced.Store(true) }

// NewView makes an empty view.
func NewView() *View {
	return &View{exports: map[registry.Key][]registry.Export{}, unreadable: map[registry.Key]bool{},
		heard: map[registry.Key]bool{}, witnessed: map[registry.Key]bool{}, events: make(chan event.GenericEvent, 4096)}
}

// Unreadable says a service could not be read: nothing of its import is
// changed or removed until Set says what it is.
func (v *View) Unreadable(key registry.Key) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.unreadable[key] = true
}

func (v *View) isUnreadable(key registry.Key) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.unreadable[key]
}

// Set records a service's exports (none: not exported anywhere).
func (v *View) Set(key registry.Key, exports []registry.Export) {
	v.mu.Lock()
	delete(v.unreadable, key)
	v.heard[key] = true
	if len(exports) == 0 {
		delete(v.exports, key)
	} else {
		v.exports[key] = exports
		v.witnessed[key] = true
	}
	v.mu.Unlock()
	v.events <- event.GenericEvent{Object: &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
}

// Heard says whether the registry told of a service since the view was
// made, and whether it told exports of it.
func (v *View) Heard(key registry.Key) (heard, witnessed bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.heard[key], v.witnessed[key]
}

// Get returns a service's exports.
func (v *View) Get(key registry.Key) []registry.Export {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.exports[key]
}

// InNamespace lists the exported services of a namespace.
func (v *View) InNamespace(ns string) []registry.Key {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var keys []registry.Key
	for k := range v.exports {
		if k.Namespace == ns {
			keys = append(keys, k)
		}
	}
	return keys
}

// LocalFirst lists the services some export of which asks for local-first
// routing: their imports depend on where this cluster's nodes are.
func (v *View) LocalFirst() []registry.Key {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var keys []registry.Key
	for k, exports := range v.exports {
		if slices.ContainsFunc(exports, func(e registry.Export) bool { return locality.Asks(e.TrafficDistribution) }) {
			keys = append(keys, k)
		}
	}
	return keys
}
