package replication

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestCollectGone(t *testing.T) {
	replica := func(ns, name, from string) client.Object {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelSourceCluster: from}}}
	}
	slice := func(ns, name, from string) client.Object {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelSourceCluster: from}}}
	}
	objs := []client.Object{
		replica("web", "a", "down-peer"), // configured, unreachable
		replica("web", "b", "removed"),
		slice("web", "b-removed", "removed"),
		replica("web", "c", "us"),
		replica("other", "d", "removed"), // not replicated here
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "plain"}},
	}
	p := GCPolicy{Cluster: "us", Peer: func(c string) bool { return c == "down-peer" }, InScope: func(ns string) bool { return ns == "web" }, Grace: 10 * time.Minute}
	t0 := time.Unix(1e9, 0)
	names := func(del []client.Object) []string {
		var out []string
		for _, o := range del {
			out = append(out, o.GetNamespace()+"/"+o.GetName())
		}
		return out
	}
	var absent map[string]time.Time
	for _, step := range []struct {
		at      time.Duration
		objs    []client.Object
		deleted []string
		absent  []string
	}{
		{at: 0, objs: objs, deleted: nil, absent: []string{"removed"}},
		{at: 9 * time.Minute, objs: objs, deleted: nil, absent: []string{"removed"}},
		{at: 10 * time.Minute, objs: objs, deleted: []string{"web/b", "web/b-removed"}, absent: []string{"removed"}},
		// Gone: the timer is dropped; the same source seen again starts over.
		{at: 11 * time.Minute, objs: objs[:1], deleted: nil, absent: nil},
		{at: 12 * time.Minute, objs: objs, deleted: nil, absent: []string{"removed"}},
		{at: 21 * time.Minute, objs: objs, deleted: nil, absent: []string{"removed"}},
		{at: 22 * time.Minute, objs: objs, deleted: []string{"web/b", "web/b-removed"}, absent: []string{"removed"}},
	} {
		var del []client.Object
		del, absent, _ = CollectGone(step.objs, p, absent, t0.Add(step.at))
		if got := names(del); !slices.Equal(got, step.deleted) {
			t.Errorf("at %v: deleted %v, want %v", step.at, got, step.deleted)
		}
		var srcs []string
		for s := range absent {
			srcs = append(srcs, s)
		}
		if !slices.Equal(srcs, step.absent) {
			t.Errorf("at %v: absent %v, want %v", step.at, srcs, step.absent)
		}
	}
}

// Every source of the replicas gone from the peers directory at once (an
// emptied or mis-keyed peers Secret) deletes nothing, however long, and
// says which; one configured source left, the others go after the grace.
func TestCollectGoneAllAtOnce(t *testing.T) {
	replica := func(name, from string) client.Object {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name, Labels: map[string]string{LabelSourceCluster: from}}}
	}
	objs := []client.Object{replica("a", "p1"), replica("b", "p2")}
	none := GCPolicy{Cluster: "us", Peer: func(string) bool { return false }, InScope: func(string) bool { return true }, Grace: 10 * time.Minute}
	t0 := time.Unix(1e9, 0)
	_, absent, _ := CollectGone(objs, none, nil, t0)
	del, absent, held := CollectGone(objs, none, absent, t0.Add(time.Hour))
	if len(del) != 0 || !slices.Equal(held, []string{"p1", "p2"}) {
		t.Fatalf("every source absent an hour: deleted %d, held %v; want none deleted, p1 and p2 held", len(del), held)
	}
	p2 := none
	p2.Peer = func(c string) bool { return c == "p2" }
	if del, _, held := CollectGone(objs, p2, absent, t0.Add(time.Hour)); len(del) != 1 || del[0].GetName() != "a" || len(held) != 0 {
		t.Errorf("p2 configured: deleted %d, held %v; want p1's replica deleted", len(del), held)
	}
}

func TestResyncKeys(t *testing.T) {
	svc := func(ns, name string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	got := ResyncKeys([][]corev1.Service{
		{svc("web", "b"), svc("web", "a"), svc("kube-system", "dns")},
		{svc("web", "a"), svc("web", "c")},
	}, func(ns string) bool { return ns != "kube-system" })
	want := []ktypes.NamespacedName{{Namespace: "web", Name: "a"}, {Namespace: "web", Name: "b"}, {Namespace: "web", Name: "c"}}
	if !slices.Equal(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
}
