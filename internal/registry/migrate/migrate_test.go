package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/memory"
	"github.com/clustermap/clustermap/internal/registry/migrate"
)

// heard is what a sink was told last, by service: each cluster's export
// and where it was read from (the export's Region, set per store here).
type heard struct {
	mu     sync.Mutex
	got    map[registry.Key][]string
	synced bool
}

func (h *heard) Set(key registry.Key, exports []registry.Export) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var c []string
	for _, e := range exports {
		c = append(c, e.Cluster+"@"+e.Region)
	}
	slices.Sort(c)
	h.got[key] = c
}
func (h *heard) Unreadable(registry.Key) {}
func (h *heard) Synced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.synced = true
}

func (h *heard) wait(t *testing.T, key registry.Key, want ...string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h.mu.Lock()
		got := h.got[key]
		h.mu.Unlock()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: heard %v, want %v", key, got, want)
		}
	}
}

// stamped marks what a store's registry reads with a name, as a Region.
type stamped struct {
	registry.Registry
	name string
}

func (s stamped) Watch(ctx context.Context, sink registry.Sink) error {
	return s.Registry.Watch(ctx, stampSink{sink, s.name})
}

type stampSink struct {
	registry.Sink
	name string
}

func (s stampSink) Set(key registry.Key, exports []registry.Export) {
	out := slices.Clone(exports)
	for i := range out {
		out[i].Region = s.name
	}
	s.Sink.Set(key, out)
}

// Clusters move one at a time: a cluster not moved is read from the old
// registry, a moving one (both) from the new, a leaving one's old records
// go, and a service the leaving cluster stops exporting goes everywhere.
// Every step, every importer hears every cluster's export.
func TestClustersMoveOneAtATime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	oldStore, newStore := memory.NewStore(), memory.NewStore()
	old := func(c string) registry.Registry { return stamped{oldStore.Registry("set", c), "old"} }
	moving := func(c string, phase migrate.Phase) registry.Registry {
		return &migrate.Registry{To: stamped{newStore.Registry("set", c), "new"}, From: old(c), Phase: phase}
	}
	web := registry.Key{Namespace: "ns", Name: "web"}
	exp := func(c string) registry.Export {
		return registry.Export{ClusterSet: "set", Cluster: c, Key: web, Created: time.Unix(1, 0)}
	}
	watch := func(r registry.Registry) *heard {
		h := &heard{got: map[registry.Key][]string{}}
		go func() { _ = r.Watch(ctx, h) }()
		return h
	}
	// a and b on the old registry; an importer i moving from the start.
	for _, c := range []string{"a", "b"} {
		if err := old(c).Publish(ctx, exp(c)); err != nil {
			t.Fatal(err)
		}
	}
	onOld, moved := watch(old("i")), watch(moving("i", migrate.Both))
	onOld.wait(t, web, "a@old", "b@old")
	moved.wait(t, web, "a@old", "b@old")

	// a moves: written to both, read from the new one by the movers.
	a := moving("a", migrate.Both)
	if err := a.Publish(ctx, exp("a")); err != nil {
		t.Fatal(err)
	}
	onOld.wait(t, web, "a@old", "b@old")
	moved.wait(t, web, "a@new", "b@old")

	// b moves too; then a leaves the old registry.
	if err := moving("b", migrate.Both).Publish(ctx, exp("b")); err != nil {
		t.Fatal(err)
	}
	moved.wait(t, web, "a@new", "b@new")
	a = moving("a", migrate.Leaving)
	if err := a.Publish(ctx, exp("a")); err != nil {
		t.Fatal(err)
	}
	onOld.wait(t, web, "b@old")
	moved.wait(t, web, "a@new", "b@new")

	// a, leaving, stops exporting: gone from both.
	if err := a.Withdraw(ctx, web); err != nil {
		t.Fatal(err)
	}
	moved.wait(t, web, "b@new")
	if !moved.synced {
		t.Error("never synced")
	}
}

func TestMerge(t *testing.T) {
	e := func(c, r string) registry.Export { return registry.Export{Cluster: c, Region: r} }
	got := migrate.Merge([]registry.Export{e("a", "new")}, []registry.Export{e("a", "old"), e("b", "old")})
	if fmt.Sprint(got) != fmt.Sprint([]registry.Export{e("a", "new"), e("b", "old")}) {
		t.Errorf("merged %v", got)
	}
}
