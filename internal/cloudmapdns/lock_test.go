package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// memLocks is a LockStore in memory; before runs ahead of each call, so a
// case can change the store between the protocol's steps.
type memLocks struct {
	byName map[string]string // name -> id
	holder map[string]string // id -> holder
	next   int
	before func(op string, m *memLocks)
	calls  []string
}

func newMemLocks() *memLocks {
	return &memLocks{byName: map[string]string{}, holder: map[string]string{}}
}

func (m *memLocks) hook(op string) {
	m.calls = append(m.calls, op)
	if m.before != nil {
		m.before(op, m)
	}
}

func (m *memLocks) put(name, holder string) string {
	m.next++
	id := fmt.Sprintf("srv-%d", m.next)
	m.byName[name], m.holder[id] = id, holder
	return id
}

func (m *memLocks) drop(name string) {
	delete(m.holder, m.byName[name])
	delete(m.byName, name)
}

func (m *memLocks) CreateLock(_ context.Context, _, name, holder string) (string, error) {
	m.hook("create")
	if id, ok := m.byName[name]; ok {
		return "", &LockTaken{ID: id}
	}
	return m.put(name, holder), nil
}

func (m *memLocks) LockHolder(_ context.Context, id string) (string, error) {
	m.hook("read")
	h, ok := m.holder[id]
	if !ok {
		return "", ErrLockGone
	}
	return h, nil
}

func (m *memLocks) DeleteLock(_ context.Context, id string) error {
	m.hook("delete")
	for name, i := range m.byName {
		if i == id {
			m.drop(name)
		}
	}
	return nil
}

func TestClaimProtocol(t *testing.T) {
	const us, them = "c1/web/nginx", "c2/web/nginx"
	lock := LockName("nginx")
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		setup  func(m *memLocks) Claim // returns what the caller knows
		before func(op string, m *memLocks)
		run    func(m *memLocks, known Claim) (Claim, error)
		held   bool   // by us, afterwards
		holder string // in the store afterwards ("" = no lock)
		calls  []string
	}{
		{name: "free: taken in one call",
			run:  func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held: true, holder: us, calls: []string{"create"}},
		{name: "held by another: read once",
			setup: func(m *memLocks) Claim { m.put(lock, them); return Claim{} },
			run:   func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held:  false, holder: them, calls: []string{"create", "read"}},
		{name: "held by another, as last seen: no read",
			setup: func(m *memLocks) Claim { return Claim{LockID: m.put(lock, them), Holder: them} },
			run:   func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held:  false, holder: them, calls: []string{"create"}},
		{name: "held by us since before a restart",
			setup: func(m *memLocks) Claim { m.put(lock, us); return Claim{} },
			run:   func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held:  true, holder: us, calls: []string{"create", "read"}},
		{name: "released between our create and our read: taken on the next try",
			setup: func(m *memLocks) Claim { m.put(lock, them); return Claim{} },
			before: func(op string, m *memLocks) {
				if op == "read" {
					m.drop(lock)
				}
			},
			run:  func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held: true, holder: us, calls: []string{"create", "read", "create"}},
		{name: "replaced since last seen: read again",
			setup: func(m *memLocks) Claim {
				old := Claim{LockID: m.put(lock, them), Holder: them}
				m.drop(lock)
				m.put(lock, "c3/web/nginx")
				return old
			},
			run:  func(m *memLocks, k Claim) (Claim, error) { return Acquire(ctx, m, "ns", "nginx", us, k) },
			held: false, holder: "c3/web/nginx", calls: []string{"create", "read"}},
		{name: "verify: still ours",
			setup: func(m *memLocks) Claim { return Claim{LockID: m.put(lock, us), Holder: us} },
			run:   func(m *memLocks, k Claim) (Claim, error) { return Verify(ctx, m, "ns", "nginx", us, k) },
			held:  true, holder: us, calls: []string{"read"}},
		{name: "verify: deleted out of band, taken again",
			setup: func(m *memLocks) Claim { k := Claim{LockID: m.put(lock, us), Holder: us}; m.drop(lock); return k },
			run:   func(m *memLocks, k Claim) (Claim, error) { return Verify(ctx, m, "ns", "nginx", us, k) },
			held:  true, holder: us, calls: []string{"read", "create"}},
		{name: "verify: deleted out of band and taken by another: lost",
			setup: func(m *memLocks) Claim {
				k := Claim{LockID: m.put(lock, us), Holder: us}
				m.drop(lock)
				m.put(lock, them)
				return k
			},
			run:  func(m *memLocks, k Claim) (Claim, error) { return Verify(ctx, m, "ns", "nginx", us, k) },
			held: false, holder: them, calls: []string{"read", "create", "read"}},
		{name: "release: deletes our lock",
			setup: func(m *memLocks) Claim { return Claim{LockID: m.put(lock, us), Holder: us} },
			run: func(m *memLocks, k Claim) (Claim, error) {
				return Claim{}, Release(ctx, m, k, []string{us})
			},
			held: false, holder: "", calls: []string{"delete"}},
		{name: "release: never another's",
			setup: func(m *memLocks) Claim { return Claim{LockID: m.put(lock, them), Holder: them} },
			run: func(m *memLocks, k Claim) (Claim, error) {
				return Claim{}, Release(ctx, m, k, []string{us})
			},
			held: false, holder: them, calls: nil},
		{name: "release: a lock replaced since is left alone",
			setup: func(m *memLocks) Claim {
				k := Claim{LockID: m.put(lock, us), Holder: us}
				m.drop(lock)
				m.put(lock, them)
				return k
			},
			run: func(m *memLocks, k Claim) (Claim, error) {
				return Claim{}, Release(ctx, m, k, []string{us})
			},
			held: false, holder: them, calls: []string{"delete"}},
		{name: "release: held under the cluster's former name",
			setup: func(m *memLocks) Claim { return Claim{LockID: m.put(lock, "old/web/nginx"), Holder: "old/web/nginx"} },
			run: func(m *memLocks, k Claim) (Claim, error) {
				return Claim{}, Release(ctx, m, k, []string{us, "old/web/nginx"})
			},
			held: false, holder: "", calls: []string{"delete"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMemLocks()
			var known Claim
			if c.setup != nil {
				known = c.setup(m)
			}
			m.before, m.calls = c.before, nil
			got, err := c.run(m, known)
			if err != nil {
				t.Fatal(err)
			}
			if got.HeldBy([]string{us, "old/web/nginx"}) != c.held {
				t.Errorf("held %v (%+v), want %v", !c.held, got, c.held)
			}
			if h := m.holder[m.byName[lock]]; h != c.holder {
				t.Errorf("lock holder %q, want %q", h, c.holder)
			}
			if !slices.Equal(m.calls, c.calls) {
				t.Errorf("calls %v, want %v", m.calls, c.calls)
			}
		})
	}
}

func TestClaimGivesUpWhenTheLockKeepsChanging(t *testing.T) {
	m := newMemLocks()
	m.put(LockName("x"), "c2/a/b")
	m.before = func(op string, m *memLocks) {
		if op == "read" { // every read finds the lock gone, every create finds it back
			m.drop(LockName("x"))
		} else if op == "create" && m.byName[LockName("x")] == "" {
			m.put(LockName("x"), "c2/a/b")
		}
	}
	if _, err := Acquire(context.Background(), m, "ns", "x", "c1/a/b", Claim{}); err == nil {
		t.Fatal("no error")
	}
}

func TestOwners(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "nginx", Annotations: map[string]string{
		AnnotationOwners: "old/web/nginx  other/web/api uid-1/web/nginx c1/web/nginx /web/nginx junk"}}}
	got := Owners("c1", svc)
	if want := []string{"c1/web/nginx", "old/web/nginx", "uid-1/web/nginx"}; !slices.Equal(got, want) {
		t.Errorf("owners %v, want %v: another Service's or malformed values are never ours", got, want)
	}
	if got := RecordOwners("old/web/nginx", "c1/web/nginx", "old/web/nginx"); got != "old/web/nginx c1/web/nginx" {
		t.Errorf("recorded %q", got)
	}
	if got := RecordOwners("c1/web/nginx", "c1/web/nginx"); got != "c1/web/nginx" {
		t.Errorf("recorded %q", got)
	}
}

// TestClaimRace: claimants with their own clients race for one name on the
// emulator over HTTP; in every round exactly one holds it, and after it
// lets go, exactly one of the others.
// emulator serves an in-process Cloud Map emulator with one private DNS
// namespace, name; newClient makes an SDK client of it.
func emulator(t *testing.T, name string) (newClient func() *sd.Client, nsID string) {
	t.Helper()
	return emulatorWith(t, cloudmaplocal.Options{}, name)
}

// emulatorWith is emulator with the emulator's options o.
func emulatorWith(t *testing.T, o cloudmaplocal.Options, name string) (newClient func() *sd.Client, nsID string) {
	t.Helper()
	srv := cloudmaptest.Start(t, o)
	newClient = func() *sd.Client { return srv.Client(t, cloudmapclient.Options{}) }
	// Made again should Cloud Map fail it late (the aws profile's 0.5%).
	return newClient, cloudmaptest.DNSNamespace(t, newClient(), name, "vpc-1")
}

func TestClaimRace(t *testing.T) {
	ctx := context.Background()
	newClient, nsID := emulator(t, "race.local")
	const claimants, rounds = 20, 20
	stores := make([]CloudMap, claimants)
	for i := range stores {
		stores[i] = CloudMap{newClient()}
	}
	race := func(host string, who []int) (winners []int, seen map[string]int) {
		var mu sync.Mutex
		seen = map[string]int{}
		var wg sync.WaitGroup
		for _, i := range who {
			wg.Go(func() {
				c, err := Acquire(ctx, stores[i], nsID, host, fmt.Sprintf("c%d/ns%d/svc", i%2, i), Claim{})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("claimant %d: %v", i, err)
					return
				}
				seen[c.Holder]++
				if c.HeldBy([]string{fmt.Sprintf("c%d/ns%d/svc", i%2, i)}) {
					winners = append(winners, i)
				}
			})
		}
		wg.Wait()
		return winners, seen
	}
	for round := range rounds {
		host := fmt.Sprintf("web-%d", round)
		all := make([]int, claimants)
		for i := range all {
			all[i] = i
		}
		winners, seen := race(host, all)
		if len(winners) != 1 || len(seen) != 1 {
			t.Fatalf("round %d: winners %v, holders seen %v; want exactly one, seen by all", round, winners, seen)
		}
		// The winner lets go; the others race again.
		first := winners[0]
		owner := fmt.Sprintf("c%d/ns%d/svc", first%2, first)
		c, err := Acquire(ctx, stores[first], nsID, host, owner, Claim{})
		if err != nil || !c.HeldBy([]string{owner}) {
			t.Fatalf("round %d: the winner reads %+v, %v", round, c, err)
		}
		if err := Release(ctx, stores[first], c, []string{owner}); err != nil {
			t.Fatal(err)
		}
		rest := slices.DeleteFunc(all, func(i int) bool { return i == first })
		if winners, seen := race(host, rest); len(winners) != 1 || len(seen) != 1 {
			t.Fatalf("round %d, after release: winners %v, holders seen %v", round, winners, seen)
		}
	}
	// A lock is an API-only service: nothing of it shows in DNS.
	out, err := newClient().ListServices(ctx, &sd.ListServicesInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range out.Services {
		if s.DnsConfig != nil || s.Type != "HTTP" {
			t.Errorf("lock %s: type %s, DNS %+v", aws.ToString(s.Name), s.Type, s.DnsConfig)
		}
	}
	var gone error = ErrLockGone
	if _, err := stores[0].LockHolder(ctx, "srv-doesnotexist"); !errors.Is(err, gone) {
		t.Errorf("reading a deleted lock: %v, want ErrLockGone", err)
	}
}

func TestNextStep(t *testing.T) {
	us := []string{"c1/web/nginx", "old/web/nginx"}
	ours, former, theirs := Claim{LockID: "srv-1", Holder: "c1/web/nginx"}, Claim{LockID: "srv-1", Holder: "old/web/nginx"}, Claim{LockID: "srv-2", Holder: "c2/web/nginx"}
	for _, c := range []struct {
		name                           string
		claim                          Claim
		held, registeredThere, abandon bool
		want                           ClaimStep
		asked                          bool // whether abandoned() may be asked
	}{
		{"ours, known", ours, true, true, false, KeepRegistering, false},
		{"ours, new", ours, false, false, false, StartRegistering, false},
		{"ours since a restart", ours, false, true, false, StartRegistering, false},
		{"ours under the cluster's former name", former, false, true, false, StartRegistering, false},
		{"theirs", theirs, false, false, false, Wait, true},
		{"theirs, held by a gone Service of ours", theirs, false, false, true, TakeOverAbandoned, true},
		{"lost while running", theirs, true, true, true, WithdrawAndWait, false},
		{"lost while down", theirs, false, true, true, WithdrawAndWait, false},
	} {
		asked := false
		got := NextStep(c.claim, us, c.held, c.registeredThere, func() bool { asked = true; return c.abandon })
		if got != c.want {
			t.Errorf("%s: step %d, want %d", c.name, got, c.want)
		}
		if asked && !c.asked {
			t.Errorf("%s: asked whether the holder is abandoned (a read) when it needs not be", c.name)
		}
	}
}
