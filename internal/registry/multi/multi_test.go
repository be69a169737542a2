package multi_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/memory"
	"github.com/clustermap/clustermap/internal/registry/multi"
)

type heard struct {
	mu       sync.Mutex
	clusters map[registry.Key][]string
	synced   bool
	unread   []registry.Key
}

func (h *heard) Set(key registry.Key, exports []registry.Export) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var c []string
	for _, e := range exports {
		c = append(c, e.Cluster)
	}
	slices.Sort(c)
	h.clusters[key] = c
}
func (h *heard) Unreadable(key registry.Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unread = append(h.unread, key)
}
func (h *heard) Synced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.synced = true
}

func (h *heard) of(key registry.Key) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.clusters[key]
}

// gate is a source whose Watch starts only when opened: a Region not
// read yet.
type gate struct {
	registry.Registry
	open chan struct{}
}

func (g gate) Watch(ctx context.Context, sink registry.Sink) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil
	}
	return g.Registry.Watch(ctx, sink)
}

// Two Regions, each a store: a cluster publishes to its home Region only
// and hears both, merged; a Region that fails keeps what it said and does
// not hold the other up; Synced waits for every Region.
func TestRegionsMerge(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	east, west := memory.NewStore(), memory.NewStore()
	later := gate{west.Registry("set", "a"), make(chan struct{})}
	a := &multi.Registry{Home: east.Registry("set", "a"), Sources: []multi.Source{{Name: "us-east-1", Registry: east.Registry("set", "a")}, {Name: "eu-west-1", Registry: later}}}
	h := &heard{clusters: map[registry.Key][]string{}}
	go func() { _ = a.Watch(ctx, h) }()
	web := registry.Key{Namespace: "ns", Name: "web"}
	exp := func(cluster string) registry.Export {
		return registry.Export{ClusterSet: "set", Cluster: cluster, Key: web, Created: time.Unix(1, 0)}
	}
	wait := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !f(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}

	// The home Region is heard at once; Synced waits for the other.
	must(t, a.Publish(ctx, exp("a")))
	if err := west.Registry("set", "b").Publish(ctx, exp("b")); err != nil {
		t.Fatal(err)
	}
	wait("a's own export", func() bool { return slices.Equal(h.of(web), []string{"a"}) })
	h.mu.Lock()
	early := h.synced
	h.mu.Unlock()
	if early {
		t.Fatal("Synced before every Region was read")
	}
	if got := east.Exports("set", web); len(got) != 1 || got[0].Cluster != "a" {
		t.Fatalf("the home Region holds %v", got)
	}
	if len(west.Exports("set", web)) != 1 {
		t.Fatal("a published outside its home Region")
	}
	close(later.open)
	wait("both Regions merged", func() bool { return slices.Equal(h.of(web), []string{"a", "b"}) })
	wait("Synced", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.synced })

	// The other Region fails: its part stays while the home Region changes.
	west.Fail(errors.New("eu-west-1 is down"))
	must(t, a.Publish(ctx, exp("a")))
	if err := east.Registry("set", "c").Publish(ctx, exp("c")); err != nil {
		t.Fatal(err)
	}
	wait("a change at home, b kept", func() bool { return slices.Equal(h.of(web), []string{"a", "b", "c"}) })

	// A withdrawal at home leaves the other Region's part.
	must(t, a.Withdraw(ctx, web))
	wait("a's withdrawal", func() bool { return slices.Equal(h.of(web), []string{"b", "c"}) })
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// unreadableSource is a Region whose reads of one service fail.
type unreadableSource struct {
	registry.Registry
	key registry.Key
}

func (u unreadableSource) Watch(ctx context.Context, sink registry.Sink) error {
	sink.Unreadable(u.key)
	sink.Synced()
	<-ctx.Done()
	return nil
}

// One Region saying a service is not there while another cannot read it
// is no knowledge that it is exported nowhere: the sink hears it is
// unreadable, and its import stays (a restart after an unshare removed it).
func TestAbsentHereUnreadableThereIsUnreadable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := registry.Key{Namespace: "ns", Name: "api"}
	east, west := memory.NewStore(), memory.NewStore()
	m := &multi.Registry{Home: west.Registry("set", "b"), Sources: []multi.Source{
		{Name: "us-east-1", Registry: unreadableSource{east.Registry("set", "b"), key}},
		{Name: "eu-west-1", Registry: west.Registry("set", "b")},
	}}
	h := &heard{clusters: map[registry.Key][]string{}}
	go func() { _ = m.Watch(ctx, h) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.mu.Lock()
		synced := h.synced
		h.mu.Unlock()
		if synced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	m.Check(key) // eu-west-1 reads it: not there
	h.mu.Lock()
	_, set := h.clusters[key]
	unread := len(h.unread)
	h.mu.Unlock()
	if set || unread != 2 {
		t.Errorf("the sink heard Set %v and %d Unreadable, want no Set and two Unreadable", set, unread)
	}
}
