//go:build e2e

package cloudmap_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Heartbeat, TTL and the one-account proof reads are seconds here rather
// than the shipped 10 minutes, 30 minutes and 1 minute, so that the tests
// take seconds, not an hour; the TTL leaves room for how old a live proof
// can look: a heartbeat, its write's operation (up to 4 s; a heartbeat
// while the last one runs is skipped), the read lag (2 s), the next poll
// and its time in whole seconds.
var fastLiveness = cloudmap.WatchOptions{Heartbeat: 2 * time.Second, SilentAfter: 20 * time.Second, ProofReadInterval: time.Second}

// drainWithin is how long a drain may take under fastLiveness: the TTL
// counts from when an importer saw the last heartbeat move (its operation,
// up to 4 s, and the read lag, up to 2 s, after the controller stopped),
// and is judged at the next read.
const drainWithin = time.Minute

// silentThenBack: west stops proving alive (its controller stops; its
// records stay in Cloud Map): east keeps west's export but drains it, and
// restores it once a new west controller writes again. Forgetting west is
// refused while it is alive; once it is silent again, forgetting it (as
// east's account, the owner) removes it from east's import.
func silentThenBack(t *testing.T, ctx context.Context, east *member, owner string, startWest func(context.Context) *member) {
	t.Helper()
	web := registry.Key{Namespace: "apps", Name: "web"}
	westCtx, stopWest := context.WithCancel(ctx)
	started := time.Now()
	west := startWest(westCtx)
	waitUntil(t, "west's export", func() bool { return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil })
	waitUntil(t, "east imports both", func() bool { return len(east.clusters(web)) == 2 })
	if got := east.drained(web); len(got) != 0 {
		t.Fatalf("drained %v while both prove alive", got)
	}
	waitUntil(t, "west's proof read", func() bool { return east.proved("west", started) })
	stopWest()
	waitWithin(t, drainWithin, "west drained", func() bool { return slices.Equal(east.drained(web), []string{"west"}) })
	if got := east.clusters(web); len(got) != 2 {
		t.Fatalf("a drained cluster's export is kept: heard %v", got)
	}
	westCtx, stopWest = context.WithCancel(ctx)
	started = time.Now()
	west = startWest(westCtx)
	waitUntil(t, "west's export again", func() bool { return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil })
	waitUntil(t, "west restored", func() bool { return len(east.drained(web)) == 0 && len(east.clusters(web)) == 2 })
	east.mu.Lock()
	if !slices.Equal(east.silentEvents, []string{"west:true", "west:false"}) {
		t.Errorf("silent events %v, want west drained then restored", east.silentEvents)
	}
	east.mu.Unlock()

	forget := cloudmap.ForgetOptions{ClusterSet: "set", Cluster: "west", Owner: owner, SilentAfter: fastLiveness.SilentAfter}
	var alive *cloudmap.AliveError
	if _, err := cloudmap.Forget(ctx, east.c, forget); !errors.As(err, &alive) {
		t.Fatalf("forgetting a live cluster: %v, want refused", err)
	}
	waitUntil(t, "west's proof read again", func() bool { return east.proved("west", started) })
	stopWest()
	waitWithin(t, drainWithin, "west drained again", func() bool { return slices.Equal(east.drained(web), []string{"west"}) })
	n, err := cloudmap.Forget(ctx, east.c, forget)
	if err != nil || n < 2 {
		t.Fatalf("forget: %d records, %v; want its export and its record", n, err)
	}
	waitUntil(t, "west gone from east's import", func() bool { return slices.Equal(east.clusters(web), []string{"east"}) })
}

func TestSilentClusterDrainedAcrossAccounts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := accountsEmulator(t)
	if err := fastLiveness.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (cloudmap.WatchOptions{SilentAfter: time.Minute}).Validate(); err == nil {
		t.Error("a TTL under three shipped heartbeats (10 min) was accepted")
	}
	east := newMember(t, ctx, srv, "AKIDOWNER", ownerAccount, "east", fastLiveness)
	if err := publish(ctx, east.b, export("east", registry.Key{Namespace: "apps", Name: "web"}, "10.1.0.1")); err != nil {
		t.Fatal(err)
	}
	shareWithMember(t, srv, east)
	silentThenBack(t, ctx, east, ownerAccount, func(ctx context.Context) *member {
		return newMember(t, ctx, srv, "AKIDMEMBER", memberAccount, "west", fastLiveness)
	})
}

func TestSilentClusterDrainedInOneAccount(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	east := newCluster(t, ctx, srv, "AKIDEAST", "", "", "east", fastLiveness)
	if err := publish(ctx, east.b, export("east", registry.Key{Namespace: "apps", Name: "web"}, "10.1.0.1")); err != nil {
		t.Fatal(err)
	}
	silentThenBack(t, ctx, east, "", func(ctx context.Context) *member {
		return newCluster(t, ctx, srv, "AKIDWEST", "", "", "west", fastLiveness)
	})
}

// A cluster forgotten with --force as its controller stops may have a
// registration under way, which no read shows until it ends: the forget
// takes it out too, once it has. (Before, such a record landed after the
// forget and stayed in every import: TestLocalFirst's forget, once in
// about ten runs.)
func TestForcedForgetTakesAWriteUnderWay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(4 * time.Second)})
	east := newCluster(t, ctx, srv, "AKIDEAST", "", "", "east", fastLiveness)
	westCtx, stopWest := context.WithCancel(ctx)
	west := newCluster(t, westCtx, srv, "AKIDWEST", "", "", "west", fastLiveness)
	web, api := registry.Key{Namespace: "apps", Name: "web"}, registry.Key{Namespace: "apps", Name: "api"}
	if err := publish(ctx, west.b, export("west", web, "10.2.0.1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "east imports west's web", func() bool { return slices.Equal(east.clusters(web), []string{"west"}) })
	// A new export, its records' operations running as the controller stops.
	if err := west.b.Publish(ctx, export("west", api, "10.2.0.2")); err != nil && !errors.Is(err, registry.ErrPending) {
		t.Fatal(err)
	}
	stopWest()
	n, err := cloudmap.Forget(ctx, east.c, cloudmap.ForgetOptions{ClusterSet: "set", Cluster: "west", Force: true})
	if err != nil {
		t.Fatalf("forget: %v", err)
	}
	// What finished operations wrote (ListInstances: no read lag); a
	// failed call (the account's quota) counts as not known yet.
	setup := srv.Client(t, srv.Shipped())
	held := func() int {
		svcs, err := setup.ListServices(ctx, &sd.ListServicesInput{})
		if err != nil {
			return -1
		}
		n := 0
		for _, svc := range svcs.Services {
			out, err := setup.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: svc.Id})
			if err != nil {
				return -1
			}
			for _, in := range out.Instances {
				if in.Attributes[recordfmt.AttrClusterID] == "west" {
					n++
				}
			}
		}
		return n
	}
	waitWithin(t, 20*time.Second, fmt.Sprintf("no record of west left (forget took %d)", n), func() bool { return held() == 0 })
	waitUntil(t, "west gone from east's imports", func() bool { return len(east.clusters(web))+len(east.clusters(api)) == 0 })
}

// In one account a cluster's record goes with its last export, with the
// record's service and namespace: clustermap uninstall leaves nothing.
func TestRecordGoesWithTheLastExport(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	east := newCluster(t, ctx, srv, "AKIDEAST", "", "", "east", fastLiveness)
	web, api := registry.Key{Namespace: "apps", Name: "web"}, registry.Key{Namespace: "apps", Name: "api"}
	for _, k := range []registry.Key{web, api} {
		if err := publish(ctx, east.b, export("east", k, "10.1.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	setup := srv.Client(t, cloudmapclient.Options{})
	// What finished operations wrote (ListInstances): a lagging read
	// (DiscoverInstances) may show a moment before the record was written.
	records := func() int { return instancesOf(ctx, setup, registry.Key{Name: cloudmap.ChangesService}) }
	waitUntil(t, "east's record", func() bool { return records() == 1 })
	// A withdrawal waits for up to three operations in a row (a write
	// still running, the deregistration, the namespace's deletion: 4 s
	// each at most in the profile), the last one twice over (the
	// service's, then the change record's).
	withdraw := func(k registry.Key) {
		t.Helper()
		waitWithin(t, time.Minute, "withdrawn "+k.String(), func() bool { return east.b.Withdraw(ctx, k) == nil })
	}
	withdraw(web)
	if records() != 1 {
		t.Fatal("the record went while an export is left")
	}
	withdraw(api)
	// Deleting a namespace is an operation of its own, which takes time.
	waitUntil(t, "no namespace left after the last withdrawal", func() bool {
		nss, err := setup.ListNamespaces(ctx, &sd.ListNamespacesInput{})
		return err == nil && len(nss.Namespaces) == 0
	})
	// A withdrawal again (the controller's orphan check does that when a
	// lagging read still shows the records) brings no record back.
	if err := east.b.Withdraw(ctx, api); err != nil {
		t.Fatal(err)
	}
	time.Sleep(cloudmap.ChangeWriteInterval + cloudmaplocal.AWS().OperationTime.Max)
	nss, err := setup.ListNamespaces(ctx, &sd.ListNamespacesInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Namespaces {
		t.Errorf("after a second withdrawal: namespace %s is back", aws.ToString(ns.Name))
	}
}

// proved says whether this member read a proof of cluster's written since
// (by the controller started then; proofs are whole seconds). How soon
// after a write it is read varies with the operation's time and the read
// lag, so the proof's age says nothing.
func (m *member) proved(cluster string, since time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.proofs[cluster]
	return ok && !at.Before(since.Truncate(time.Second))
}

// A member rewriting another cluster's liveness record brings no silent
// cluster back where sharing lets it (its account is not the cluster's:
// reported), and strict sharing refuses the rewrite.
func TestForgedProofRestoresNobody(t *testing.T) {
	t.Parallel()
	for _, permissive := range []bool{false, true} {
		t.Run(fmt.Sprintf("permissive sharing %v", permissive), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures(), PermissiveSharing: permissive,
				Accounts: map[string]string{"AKIDOWNER": ownerAccount, "AKIDMEMBER": memberAccount, "AKIDHOSTILE": hostileAccount}})
			web := registry.Key{Namespace: "apps", Name: "web"}
			east := newMember(t, ctx, srv, "AKIDOWNER", ownerAccount, "east", fastLiveness)
			if err := publish(ctx, east.b, export("east", web, "10.1.0.1")); err != nil {
				t.Fatal(err)
			}
			shareWithMember(t, srv, east)
			changes := namespaceARN(t, east.c, cloudmap.ChangesNamespace("set"))
			if err := srv.Share(changes, hostileAccount); err != nil {
				t.Fatal(err)
			}
			westCtx, stopWest := context.WithCancel(ctx)
			started := time.Now()
			west := newMember(t, westCtx, srv, "AKIDMEMBER", memberAccount, "west", fastLiveness)
			waitUntil(t, "west's export", func() bool { return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil })
			waitUntil(t, "east imports both", func() bool { return len(east.clusters(web)) == 2 })
			// A cluster that never wrote a record is never drained: west
			// stops once east has read one of its.
			waitUntil(t, "west's proof read", func() bool { return east.proved("west", started) })
			stopWest()
			waitWithin(t, drainWithin, "west drained", func() bool { return slices.Equal(east.drained(web), []string{"west"}) })

			co := srv.Shipped()
			co.Credentials = credentials.NewStaticCredentialsProvider("AKIDHOSTILE", "s", "")
			hostile := srv.Client(t, co)
			svcs, err := hostile.ListServices(ctx, &sd.ListServicesInput{Filters: []types.ServiceFilter{
				{Name: types.ServiceFilterNameNamespaceId, Values: []string{changes}}}})
			if err != nil || len(svcs.Services) != 1 {
				t.Fatalf("the hostile member lists %v (%v)", svcs, err)
			}
			_, err = hostile.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: svcs.Services[0].Arn, InstanceId: aws.String("west"),
				Attributes: cloudmap.ChangeRecordAttrs("set", "west", "forged", 1, time.Now())})
			if !permissive {
				if err == nil {
					t.Fatal("strict sharing let a member rewrite another account's record")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := "west by " + hostileAccount + " not " + memberAccount
			waitUntil(t, "the rewritten record reported", func() bool {
				east.mu.Lock()
				defer east.mu.Unlock()
				for _, f := range east.foreign {
					if fmt.Sprintf("%s by %s not %s", f.Cluster, f.CreatedBy, f.Bound) == want {
						return true
					}
				}
				return false
			})
			if got := east.drained(web); !slices.Equal(got, []string{"west"}) {
				t.Errorf("drained %v after the forged proof; want west still", got)
			}
		})
	}
}

// A controller restart, a registry outage and Cloud Map failing every
// write, each longer than the TTL where it can be, drain nobody: west's
// controller stops and a new one starts 5 s later; then every call fails
// for two TTLs; then every operation fails for two TTLs while reads
// answer. Each is followed by a TTL of normal running. (A 2 s heartbeat
// and a 30 s TTL: the shipped 30 s and 2 minutes would make it take 15
// minutes; the TTL leaves a restarted controller, slowed by a loaded
// machine, 25 s to prove alive, as the shipped one leaves a minute and a
// half.)
func TestRestartAndOutagesDrainNobody(t *testing.T) {
	t.Parallel()
	liveness := cloudmap.WatchOptions{Heartbeat: 2 * time.Second, SilentAfter: 30 * time.Second, ProofReadInterval: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	web := registry.Key{Namespace: "apps", Name: "web"}
	east := newCluster(t, ctx, srv, "AKIDEAST", "", "", "east", liveness)
	if err := publish(ctx, east.b, export("east", web, "10.1.0.1")); err != nil {
		t.Fatal(err)
	}
	startWest := func() (*member, context.CancelFunc) {
		westCtx, stop := context.WithCancel(ctx)
		started := time.Now()
		west := newCluster(t, westCtx, srv, "AKIDWEST", "", "", "west", liveness)
		waitUntil(t, "west's export", func() bool { return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil })
		waitUntil(t, "west's proof read", func() bool { return east.proved("west", started) })
		return west, stop
	}
	west, stopWest := startWest()
	waitUntil(t, "east imports both", func() bool { return len(east.clusters(web)) == 2 })
	quiet := func(what string) {
		t.Helper()
		for _, m := range []*member{east, west} {
			m.mu.Lock()
			events := slices.Clone(m.silentEvents)
			m.mu.Unlock()
			if len(events) > 0 {
				t.Fatalf("after %s: drain events %v", what, events)
			}
		}
	}

	stopWest()
	time.Sleep(5 * time.Second)
	west, stopWest = startWest()
	defer stopWest()
	time.Sleep(liveness.SilentAfter)
	quiet("a controller restart")

	srv.SetFaults(cloudmaplocal.Faults{Outage: true})
	time.Sleep(2 * liveness.SilentAfter)
	srv.SetFaults(cloudmaplocal.Faults{})
	time.Sleep(liveness.SilentAfter)
	quiet("a registry outage of two TTLs")

	srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	time.Sleep(2 * liveness.SilentAfter)
	srv.SetFaults(cloudmaplocal.Faults{})
	time.Sleep(liveness.SilentAfter)
	quiet("two TTLs of every write failing")
	if got := east.clusters(web); len(got) != 2 {
		t.Errorf("east imports %v after it all, want both", got)
	}
}
