//go:build e2e

package cloudmap_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
)

const (
	ownerAccount  = "111111111111"
	memberAccount = "222222222222"
)

// member is one cluster of a clusterset spanning accounts: its backend,
// at the shipped budgets, and what its watcher heard.
type member struct {
	b            *cloudmap.Backend
	c            *sd.Client
	calls        *cloudmapclient.Calls
	mu           sync.Mutex
	heard        map[registry.Key][]registry.Export
	silentEvents []string
	foreign      []registry.ForeignRecord
	proofs       map[string]time.Time
	failures     chan registry.Key // OnWriteFailed
	usage        *cloudmap.Usage
}

func newMember(t *testing.T, ctx context.Context, srv *cloudmaptest.Emulator, key, account, cluster string, opts ...cloudmap.WatchOptions) *member {
	t.Helper()
	return newCluster(t, ctx, srv, key, ownerAccount, account, cluster, opts...)
}

// newCluster is a cluster of a clusterset in the owner's namespaces (owner
// empty: in one account).
func newCluster(t *testing.T, ctx context.Context, srv *cloudmaptest.Emulator, key, owner, account, cluster string, opts ...cloudmap.WatchOptions) *member {
	t.Helper()
	return newClusterWith(t, ctx, srv, key, owner, account, cluster, func(o *cloudmap.Options) {
		if len(opts) > 0 {
			o.Watch = opts[0]
		}
	})
}

// newClusterWith is newCluster with its options tuned.
func newClusterWith(t *testing.T, ctx context.Context, srv *cloudmaptest.Emulator, key, owner, account, cluster string, tune func(*cloudmap.Options)) *member {
	t.Helper()
	m := &member{calls: &cloudmapclient.Calls{}, heard: map[registry.Key][]registry.Export{}, failures: make(chan registry.Key, 100)}
	co := srv.Shipped()
	co.Credentials = credentials.NewStaticCredentialsProvider(key, "s", "")
	co.OnCall = m.calls.Record
	m.c = srv.Client(t, co)
	o := cloudmap.Options{ClusterSet: "set", Cluster: cluster, Controller: "test", Log: logr.Discard(), Owner: owner, Account: account,
		Observer: registry.ObserverFuncs{OnProofs: func(p map[string]time.Time, _ map[string]bool) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.proofs = p
		},
			OnSilent: func(cluster string, _ time.Time, silent bool) {
				m.mu.Lock()
				defer m.mu.Unlock()
				m.silentEvents = append(m.silentEvents, fmt.Sprintf("%s:%v", cluster, silent))
			},
			OnForeign: func(f registry.ForeignRecord) {
				m.mu.Lock()
				defer m.mu.Unlock()
				m.foreign = append(m.foreign, f)
			},
			OnWriteFailed: func(key registry.Key) {
				select {
				case m.failures <- key:
				default:
				}
			}}}
	o.Usage = cloudmap.NewUsage(0)
	tune(&o)
	m.b, m.usage = cloudmap.New(m.c, o), o.Usage
	var sink registry.Sink = registry.SinkFuncs{OnSet: func(key registry.Key, e []registry.Export) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.heard[key] = e
	}}
	if o.Formats != nil {
		sink = o.Formats.Tap(sink)
	}
	go func() { _ = m.b.Watch(ctx, sink) }()
	return m
}

// clusters lists the clusters whose exports of key this member heard.
func (m *member) clusters(key registry.Key) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.heard[key] {
		out = append(out, e.Cluster)
	}
	return out
}

// drained lists the clusters whose exports of key this member heard as
// drained for silence.
func (m *member) drained(key registry.Key) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.heard[key] {
		if !e.Silent.IsZero() {
			out = append(out, e.Cluster)
		}
	}
	return out
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	waitWithin(t, 30*time.Second, what, f)
}

// waitWithin is waitUntil with its own deadline.
func waitWithin(t *testing.T, within time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func export(cluster string, key registry.Key, ip string) registry.Export {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	return registry.Export{
		ClusterSet: "set", Cluster: cluster, Key: key, Type: mcsv1beta1.ClusterSetIP,
		Ports: []mcsv1beta1.ServicePort{http}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Created: time.UnixMilli(1700000000123),
		Endpoints: []registry.Endpoint{{IP: ip, Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Ready: true, ServicePort: http, TargetPort: "http"}},
	}
}

// namespaceARN finds a namespace the owner made.
func namespaceARN(t *testing.T, c *sd.Client, name string) string {
	t.Helper()
	ns, err := cloudmapclient.FindOwnedNamespace(context.Background(), c, name, types.NamespaceTypeHttp, ownerAccount)
	if err != nil || ns == nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	return aws.ToString(ns.Arn)
}

// accountsEmulator serves an owner and a member account.
func accountsEmulator(t *testing.T) *cloudmaptest.Emulator {
	t.Helper()
	return cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures(), Accounts: map[string]string{"AKIDOWNER": ownerAccount, "AKIDMEMBER": memberAccount}})
}

// shareWithMember waits for the namespaces the owner's first export makes
// (apps and the change records') and shares them with the member account.
func shareWithMember(t *testing.T, srv *cloudmaptest.Emulator, owner *member) {
	t.Helper()
	waitUntil(t, "the owner's change record", func() bool {
		ns, _ := cloudmapclient.FindOwnedNamespace(context.Background(), owner.c, cloudmap.ChangesNamespace("set"), types.NamespaceTypeHttp, ownerAccount)
		return ns != nil
	})
	for _, ns := range []string{"apps", cloudmap.ChangesNamespace("set")} {
		if err := srv.Share(namespaceARN(t, owner.c, ns), memberAccount); err != nil {
			t.Fatal(err)
		}
	}
}

// Two accounts, one clusterset: the owner's namespaces shared with the
// member through RAM. Exports flow both ways through the change records; a
// namespace not shared is an error naming the owner, and touches nothing;
// nobody deletes what another account created; unsharing keeps imports.
func TestClusterSetAcrossAccounts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := accountsEmulator(t)
	east := newMember(t, ctx, srv, "AKIDOWNER", ownerAccount, "east")
	west := newMember(t, ctx, srv, "AKIDMEMBER", memberAccount, "west")
	web := registry.Key{Namespace: "apps", Name: "web"}
	api2 := registry.Key{Namespace: "apps", Name: "api"}

	// Before the owner made and shared the namespace, the member's export
	// says so.
	var notShared *registry.NotSharedError
	if err := publish(ctx, west.b, export("west", web, "10.2.0.1")); !errors.As(err, &notShared) || notShared.Owner != ownerAccount || notShared.Account != memberAccount {
		t.Fatalf("publishing before the share: %v, want a NotSharedError naming both accounts", err)
	}
	if err := publish(ctx, east.b, export("east", api2, "10.1.0.1")); err != nil {
		t.Fatal(err)
	}
	shareWithMember(t, srv, east)

	// Both ways, and two accounts' exports of one service in one Cloud Map service.
	// The member finds the share on a retry (it takes a namespace it found
	// missing as such for a few seconds).
	waitUntil(t, "the member's export is published", func() bool {
		return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil
	})
	if err := publish(ctx, east.b, export("east", web, "10.1.0.2")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the member imports api", func() bool { return len(west.clusters(api2)) == 1 })
	waitUntil(t, "both hear both exports of web", func() bool {
		return len(east.clusters(web)) == 2 && len(west.clusters(web)) == 2
	})
	if n := east.calls.Snapshot()["ListOperations"] + west.calls.Snapshot()["ListOperations"]; n != 0 {
		t.Errorf("%v ListOperations calls: blind to other accounts, they are of no use here", n)
	}

	// Withdrawals: each removes only its own; the service the member
	// created is never deleted by the owner.
	// Withdrawn as the export reconciler does: again while it is pending
	// (a write of the record may still run, and then nothing is
	// deregistered yet).
	waitUntil(t, "the owner's withdrawal done", func() bool { return east.b.Withdraw(ctx, web) == nil })
	waitUntil(t, "the member hears the owner's withdrawal", func() bool { return len(west.clusters(web)) == 1 })
	svcs, err := west.c.ListServices(ctx, &sd.ListServicesInput{Filters: []types.ServiceFilter{
		{Name: types.ServiceFilterNameNamespaceId, Values: []string{namespaceARN(t, east.c, "apps")}}}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range svcs.Services {
		if aws.ToString(s.Name) == "web" {
			found = aws.ToString(s.CreatedByAccount) == memberAccount
		}
	}
	if !found {
		t.Fatalf("the member's service web is gone or not its own: %+v", svcs.Services)
	}

	// Unsharing: the member's imports stay, its next export names the share.
	if err := srv.Unshare(namespaceARN(t, east.c, "apps"), memberAccount); err != nil {
		t.Fatal(err)
	}
	if err := publish(ctx, east.b, export("east", api2, "10.1.0.9")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // past the watcher's ConfirmAbsence (5 s)
	if got := west.clusters(api2); len(got) != 1 {
		t.Fatalf("after the unshare the member imports api from %v, want east's export kept", got)
	}
	other := registry.Key{Namespace: "apps", Name: "other"}
	if err := publish(ctx, west.b, export("west", other, "10.2.0.3")); !errors.As(err, &notShared) {
		t.Fatalf("publishing after the unshare: %v, want a NotSharedError", err)
	}
}
