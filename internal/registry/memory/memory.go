// Package memory is a Registry held in memory. The clusters of a test (or
// of one process) share a Store; each gets its Registry from it. Watches
// hear every change at once, without Cloud Map's eventual consistency.
package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Store holds the exports of every clusterset and cluster.
type Store struct {
	mu      sync.Mutex
	exports map[scope]map[string]registry.Export // by service, then cluster
	watches map[*watch]bool
	err     error
}

// scope is a service in a clusterset: clustersets sharing a store never
// see each other's exports.
type scope struct {
	set string
	key registry.Key
}

type watch struct {
	set  string
	sink registry.Sink
	// mu orders what one sink hears: the calls of two changes never
	// interleave.
	mu sync.Mutex
}

// NewStore makes an empty store.
func NewStore() *Store {
	return &Store{exports: map[scope]map[string]registry.Export{}, watches: map[*watch]bool{}}
}

// Fail makes every Publish and Withdraw fail with err until Fail(nil),
// as a registry outage would; watches hear nothing meanwhile.
func (s *Store) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Exports returns every cluster's exports of a service in a clusterset,
// by cluster name order.
func (s *Store) Exports(clusterSet string, key registry.Key) []registry.Export {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exportsLocked(scope{clusterSet, key})
}

func (s *Store) exportsLocked(sc scope) []registry.Export {
	byCluster := s.exports[sc]
	out := make([]registry.Export, 0, len(byCluster))
	for _, c := range slices.Sorted(maps.Keys(byCluster)) {
		out = append(out, byCluster[c])
	}
	return out
}

// Registry is one cluster's view of the store.
func (s *Store) Registry(clusterSet, cluster string) registry.Registry {
	return &Registry{store: s, clusterSet: clusterSet, cluster: cluster}
}

// Registry publishes as one cluster of one clusterset.
type Registry struct {
	store               *Store
	clusterSet, cluster string
}

var _ registry.Registry = (*Registry)(nil)

// Publish holds e as this cluster's export; one of another cluster or
// clusterset is refused.
func (r *Registry) Publish(_ context.Context, e registry.Export) error {
	if e.Cluster != r.cluster || e.ClusterSet != r.clusterSet {
		return fmt.Errorf("export of %s by cluster %q of %q published as cluster %q of %q", e.Key, e.Cluster, e.ClusterSet, r.cluster, r.clusterSet)
	}
	return r.store.change(scope{r.clusterSet, e.Key}, func(byCluster map[string]registry.Export) {
		byCluster[r.cluster] = e
	})
}

// Withdraw removes this cluster's export of a service.
func (r *Registry) Withdraw(_ context.Context, key registry.Key) error {
	return r.store.change(scope{r.clusterSet, key}, func(byCluster map[string]registry.Export) {
		delete(byCluster, r.cluster)
	})
}

// Watch tells sink every service of the clusterset, then Synced, then each
// change, until ctx ends.
func (r *Registry) Watch(ctx context.Context, sink registry.Sink) error {
	w := &watch{set: r.clusterSet, sink: sink}
	w.mu.Lock()
	s := r.store
	s.mu.Lock()
	s.watches[w] = true
	now := map[registry.Key][]registry.Export{}
	for sc := range s.exports {
		if sc.set == r.clusterSet {
			now[sc.key] = s.exportsLocked(sc)
		}
	}
	s.mu.Unlock()
	for _, key := range slices.SortedFunc(maps.Keys(now), func(a, b registry.Key) int { return strings.Compare(a.String(), b.String()) }) {
		sink.Set(key, now[key])
	}
	sink.Synced()
	w.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.watches, w)
	s.mu.Unlock()
	return nil
}

// Check tells the clusterset's watches what the store holds of a service
// (the store is never inconsistent: no confirmation is needed).
func (r *Registry) Check(key registry.Key) {
	_ = r.store.change(scope{r.clusterSet, key}, func(map[string]registry.Export) {})
}

// change applies f to a service's exports and tells the clusterset's
// watches what it holds now.
func (s *Store) change(sc scope, f func(map[string]registry.Export)) error {
	s.mu.Lock()
	if s.err != nil {
		defer s.mu.Unlock()
		return s.err
	}
	if s.exports[sc] == nil {
		s.exports[sc] = map[string]registry.Export{}
	}
	f(s.exports[sc])
	now := s.exportsLocked(sc)
	if len(now) == 0 {
		delete(s.exports, sc)
	}
	var watches []*watch
	for w := range s.watches {
		if w.set == sc.set {
			watches = append(watches, w)
			w.mu.Lock() // taken in store order: each sink hears changes in that order
		}
	}
	s.mu.Unlock()
	for _, w := range watches {
		w.sink.Set(sc.key, now)
		w.mu.Unlock()
	}
	return nil
}
