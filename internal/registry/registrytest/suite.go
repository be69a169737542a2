// Package registrytest holds every Registry to the same behaviour: the
// memory registry the fast tests use and Cloud Map must agree on what a
// watcher hears of what clusters publish and withdraw.
package registrytest

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// New makes cluster's registry in clusterset set; every registry a test
// makes shares one backing store.
type New func(t *testing.T, set, cluster string) registry.Registry

// Within is how long a watcher may take to hear a change (Cloud Map's
// shipped poll is 1.5 s; absence is confirmed 5 s later).
const Within = 30 * time.Second

// Run runs the suite; each subtest gets a fresh store from store().
func Run(t *testing.T, store func(t *testing.T) New) {
	for name, test := range map[string]func(*testing.T, New){
		"an export is heard whole":                      exportHeardWhole,
		"clusters' exports are heard together":          exportsTogether,
		"a change and a withdrawal are heard":           changeAndWithdraw,
		"clustersets are kept apart":                    clustersetsApart,
		"a watch started later hears what is there":     lateWatch,
		"a checked service exported nowhere is told so": checkedAbsent,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, store(t))
		})
	}
}

var key = registry.Key{Namespace: "shop", Name: "cart"}

// Export is a sample export of cluster: dual-stack, two ports, every
// endpoint condition and field an import uses.
func Export(set, cluster string, pods int) registry.Export {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, AppProtocol: ptr.To("http")}
	dns := mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}
	e := registry.Export{ClusterSet: set, Cluster: cluster, Key: key, Type: mcsv1beta1.ClusterSetIP,
		Ports: []mcsv1beta1.ServicePort{http, dns}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		Labels: map[string]string{"team": "shop"}, Created: time.UnixMilli(1700000000000)}
	n := 0
	for _, c := range cluster {
		n = n*31 + int(c)
	}
	for i := range pods {
		for _, ip := range []string{fmt.Sprintf("10.%d.0.%d", n%200+1, i+1), fmt.Sprintf("fd00:%x::%x", n%200+1, i+1)} {
			for _, p := range []mcsv1beta1.ServicePort{http, dns} {
				ready := i%4 != 3
				e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ip, Port: p.Port + 8000, PortName: p.Name, Protocol: p.Protocol,
					Ready: ready, Serving: ready || i%8 == 3, Terminating: !ready, Hostname: fmt.Sprintf("cart-%d", i), NodeName: fmt.Sprintf("node-%d", i%3),
					Zone: fmt.Sprintf("use1-az%d", i%3+1), ServicePort: p, TargetPort: p.Name})
			}
		}
	}
	return e
}

// heard records what one watch told.
type heard struct {
	mu     sync.Mutex
	sets   map[registry.Key][]registry.Export
	told   map[registry.Key]bool
	synced bool
}

func watch(t *testing.T, r registry.Registry) *heard {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &heard{sets: map[registry.Key][]registry.Export{}, told: map[registry.Key]bool{}}
	go func() {
		_ = r.Watch(ctx, registry.SinkFuncs{
			OnSet: func(k registry.Key, e []registry.Export) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.sets[k], h.told[k] = e, true
			},
			OnSynced: func() {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.synced = true
			},
		})
	}()
	eventually(t, "the first sync", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.synced {
			return fmt.Errorf("not synced")
		}
		return nil
	})
	return h
}

// hears waits until the watch's last word on key is exactly want.
func (h *heard) hears(t *testing.T, want ...registry.Export) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d exports of %s", len(want), key), func() error {
		h.mu.Lock()
		got, told := h.sets[key], h.told[key]
		h.mu.Unlock()
		if len(want) == 0 && !told {
			return fmt.Errorf("nothing told of %s", key)
		}
		return same(got, want)
	})
}

// same compares what an import uses of exports.
func same(got, want []registry.Export) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d exports, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Cluster != w.Cluster || g.ClusterSet != w.ClusterSet || g.Key != w.Key || g.Type != w.Type || !g.Created.Equal(w.Created) {
			return fmt.Errorf("export %d is %s/%s %s %s of %v, want %s/%s %s %s of %v", i, g.ClusterSet, g.Cluster, g.Key, g.Type, g.Created, w.ClusterSet, w.Cluster, w.Key, w.Type, w.Created)
		}
		if !reflect.DeepEqual(g.Ports, w.Ports) || !reflect.DeepEqual(g.IPFamilies, w.IPFamilies) || !reflect.DeepEqual(g.Labels, w.Labels) {
			return fmt.Errorf("%s: ports %v families %v labels %v, want %v %v %v", g.Cluster, g.Ports, g.IPFamilies, g.Labels, w.Ports, w.IPFamilies, w.Labels)
		}
		if ge, we := canonical(g.Endpoints), canonical(w.Endpoints); !reflect.DeepEqual(ge, we) {
			return fmt.Errorf("%s: %d endpoints, want %d (or they differ)", g.Cluster, len(ge), len(we))
		}
	}
	return nil
}

func canonical(eps []registry.Endpoint) []registry.Endpoint {
	out := append([]registry.Endpoint(nil), eps...)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.IP < b.IP || a.IP == b.IP && (a.Port < b.Port || a.Port == b.Port && a.Protocol < b.Protocol)
	})
	return out
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(Within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v: %v", what, Within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publish publishes as the export reconciler does: again while the
// registry says a write is still running, or failed after it was accepted.
func publish(t *testing.T, r registry.Registry, e registry.Export) {
	t.Helper()
	eventually(t, "a finished publish", func() error { return r.Publish(context.Background(), e) })
}

func withdraw(t *testing.T, r registry.Registry) {
	t.Helper()
	eventually(t, "a finished withdrawal", func() error { return ignorePending(r.Withdraw(context.Background(), key)) })
}

func ignorePending(err error) error {
	if err == registry.ErrPending {
		return fmt.Errorf("pending")
	}
	return err
}

func exportHeardWhole(t *testing.T, n New) {
	h := watch(t, n(t, "set", "c0"))
	e := Export("set", "c1", 6)
	publish(t, n(t, "set", "c1"), e)
	h.hears(t, e)
}

func exportsTogether(t *testing.T, n New) {
	h := watch(t, n(t, "set", "c0"))
	a, b := Export("set", "c1", 2), Export("set", "c2", 3)
	publish(t, n(t, "set", "c2"), b)
	publish(t, n(t, "set", "c1"), a)
	h.hears(t, a, b)
}

func changeAndWithdraw(t *testing.T, n New) {
	h := watch(t, n(t, "set", "c0"))
	r1, r2 := n(t, "set", "c1"), n(t, "set", "c2")
	a, b := Export("set", "c1", 2), Export("set", "c2", 2)
	publish(t, r1, a)
	publish(t, r2, b)
	h.hears(t, a, b)
	a = Export("set", "c1", 5) // scaled up
	publish(t, r1, a)
	h.hears(t, a, b)
	withdraw(t, r2)
	h.hears(t, a)
	withdraw(t, r1)
	h.hears(t)
}

func clustersetsApart(t *testing.T, n New) {
	h := watch(t, n(t, "set", "c0"))
	other := Export("other", "c9", 2)
	publish(t, n(t, "other", "c9"), other)
	e := Export("set", "c1", 2)
	publish(t, n(t, "set", "c1"), e)
	h.hears(t, e)
	time.Sleep(2 * time.Second) // the other clusterset's export had time to be read too
	h.hears(t, e)
}

func lateWatch(t *testing.T, n New) {
	e := Export("set", "c1", 3)
	publish(t, n(t, "set", "c1"), e)
	h := watch(t, n(t, "set", "c0"))
	h.hears(t, e)
}

func checkedAbsent(t *testing.T, n New) {
	r := n(t, "set", "c0")
	h := watch(t, r)
	r.Check(key)
	h.hears(t)
}
