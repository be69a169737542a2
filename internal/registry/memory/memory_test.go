package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
)

type heard struct {
	mu     sync.Mutex
	sets   map[registry.Key][]registry.Export
	synced chan struct{}
}

func watchFor(t *testing.T, r registry.Registry) *heard {
	h := &heard{sets: map[registry.Key][]registry.Export{}, synced: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		_ = r.Watch(ctx, registry.SinkFuncs{
			OnSet:    func(k registry.Key, e []registry.Export) { h.mu.Lock(); h.sets[k] = e; h.mu.Unlock() },
			OnSynced: func() { close(h.synced) },
		})
	}()
	select {
	case <-h.synced:
	case <-time.After(5 * time.Second):
		t.Fatal("no Synced")
	}
	return h
}

func (h *heard) clusters(k registry.Key) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.sets[k] {
		out = append(out, e.Cluster)
	}
	return out
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	s := NewStore()
	key := registry.Key{Namespace: "ns", Name: "svc"}
	a, b, other := s.Registry("set", "a"), s.Registry("set", "b"), s.Registry("other", "a")
	if err := a.Publish(ctx, registry.Export{ClusterSet: "set", Cluster: "a", Key: key}); err != nil {
		t.Fatal(err)
	}
	// A watch started later hears what is there, then Synced.
	hb := watchFor(t, b)
	hOther := watchFor(t, other)
	if got := hb.clusters(key); len(got) != 1 || got[0] != "a" {
		t.Fatalf("b heard %v, want [a]", got)
	}
	if err := b.Publish(ctx, registry.Export{ClusterSet: "set", Cluster: "b", Key: key}); err != nil {
		t.Fatal(err)
	}
	if got := hb.clusters(key); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("b heard %v, want [a b]", got)
	}
	// Another clusterset sees none of it.
	if got := hOther.clusters(key); len(got) != 0 {
		t.Fatalf("clusterset other heard %v", got)
	}
	// A cluster publishes only as itself.
	if err := a.Publish(ctx, registry.Export{ClusterSet: "set", Cluster: "b", Key: key}); err == nil {
		t.Fatal("a published as b")
	}
	// An outage changes nothing.
	s.Fail(errors.New("down"))
	if err := a.Withdraw(ctx, key); err == nil {
		t.Fatal("withdraw during an outage succeeded")
	}
	if got := hb.clusters(key); len(got) != 2 {
		t.Fatalf("an outage changed what b heard: %v", got)
	}
	s.Fail(nil)
	for _, r := range []registry.Registry{a, b} {
		if err := r.Withdraw(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	hb.mu.Lock()
	e, said := hb.sets[key]
	hb.mu.Unlock()
	if !said || len(e) != 0 {
		t.Fatalf("after both withdrew b heard %v (said %v), want an empty Set", e, said)
	}
	if got := s.Exports("set", key); len(got) != 0 {
		t.Fatalf("store still holds %v", got)
	}
}
