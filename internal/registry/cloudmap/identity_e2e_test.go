//go:build e2e

package cloudmap_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Two clusters given the same id: each reports the other, whether they
// export the same Service (and overwrite each other's records) or
// different ones (and would merge into one cluster in every import).
func TestDuplicateClusterIDReportedOnBoth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		keyA, keyB registry.Key
	}{
		{"the same Service", registry.Key{Namespace: "web", Name: "api"}, registry.Key{Namespace: "web", Name: "api"}},
		{"different Services", registry.Key{Namespace: "web", Name: "api"}, registry.Key{Namespace: "web", Name: "db"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
			var mu sync.Mutex
			reports := map[string][]string{}
			start := func(uid string) *cloudmap.Backend {
				mark := cloudmap.WriterMark(uid)
				b := cloudmap.New(srv.Client(t, srv.Shipped()), cloudmap.Options{ClusterSet: "set", Cluster: "c1", Controller: "test", Log: logr.Discard(),
					Writer: mark, Observer: registry.ObserverFuncs{OnDuplicate: func(key registry.Key, other string) {
						mu.Lock()
						defer mu.Unlock()
						reports[mark] = append(reports[mark], fmt.Sprintf("%s by %s", key, other))
					}}})
				go func() { _ = b.Watch(ctx, registry.SinkFuncs{}) }()
				return b
			}
			a, b := start("uid-a"), start("uid-b")
			markA, markB := cloudmap.WriterMark("uid-a"), cloudmap.WriterMark("uid-b")
			if err := publish(ctx, a, export("c1", tc.keyA, "10.0.0.1")); err != nil {
				t.Fatal(err)
			}
			// The twin comes up after A's record is written and readable
			// (a cluster cloned or reinstalled with A's id). Twins that
			// write the very same record at once may leave the last
			// writer unaware: its read shows only its own write.
			awaitWritten(t, srv.Client(t, srv.Shipped()), tc.keyA)
			if err := publish(ctx, b, export("c1", tc.keyB, "10.0.0.2")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				mu.Lock()
				gotA, gotB := slices.Clone(reports[markA]), slices.Clone(reports[markB])
				mu.Unlock()
				wantA, wantB := fmt.Sprintf("%s by %s", tc.keyB, markB), fmt.Sprintf("%s by %s", tc.keyA, markA)
				if slices.Contains(gotA, wantA) && slices.Contains(gotB, wantB) {
					if len(gotA) != 1 || len(gotB) != 1 {
						t.Errorf("a duplicate is reported once per service per %v: A %v, B %v", 10*time.Minute, gotA, gotB)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("reports: A %v (want %q), B %v (want %q)", gotA, wantA, gotB, wantB)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// A twin that withdraws a Service (its ServiceExport deleted) leaves the
// records the other installation wrote under their shared id: they are
// the other's export. It reports the duplicate instead.
func TestTwinWithdrawLeavesTheOthersRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	reported := make(chan string, 10)
	a, b := installation(t, srv, "uid-a", reported), installation(t, srv, "uid-b", reported)
	key := registry.Key{Namespace: "web", Name: "api"}
	if err := publish(ctx, a, export("c1", key, "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t, srv.Shipped())
	// A's service record, with its mark, goes in after its endpoints.
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(listed(ctx, c, key), func(in recordfmt.Instance) bool {
		return in.Attrs[recordfmt.AttrWriter] == cloudmap.WriterMark("uid-a")
	}) {
		if time.Now().After(deadline) {
			t.Fatal("A's service record was not written within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(cloudmaplocal.AWS().ReadLag)
	before := len(listed(ctx, c, key))
	if err := b.Withdraw(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case other := <-reported:
		if other != cloudmap.WriterMark("uid-a") {
			t.Errorf("the duplicate is reported as written by %s, want A's mark %s", other, cloudmap.WriterMark("uid-a"))
		}
	case <-time.After(10 * time.Second):
		t.Error("the twin's withdrawal reported no duplicate")
	}
	// Any deregistration would have finished by the profile's slowest
	// operation.
	time.Sleep(cloudmaplocal.AWS().OperationTime.Max + time.Second)
	if after := len(listed(ctx, c, key)); after != before || before == 0 {
		t.Fatalf("A's records after B's withdrawal: %d, before it %d", after, before)
	}
}

// installation is cluster c1's registry side in the installation of
// kube-system UID uid; the duplicates it finds go to reported.
func installation(t *testing.T, srv *cloudmaptest.Emulator, uid string, reported chan<- string) *cloudmap.Backend {
	return cloudmap.New(srv.Client(t, srv.Shipped()), cloudmap.Options{ClusterSet: "set", Cluster: "c1", Controller: "test", Log: logr.Discard(),
		Writer: cloudmap.WriterMark(uid), Observer: registry.ObserverFuncs{OnDuplicate: func(key registry.Key, other string) { reported <- other }}})
}

// awaitWritten waits until the Cloud Map service of key holds an instance
// (ListInstances shows what finished operations wrote) and then for the
// profile's read lag, after which every read shows it.
func awaitWritten(t *testing.T, c *sd.Client, key registry.Key) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n := instancesOf(ctx, c, key); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing written within 30 s", key)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(cloudmaplocal.AWS().ReadLag)
}

// instancesOf counts the instances of key's Cloud Map service.
func instancesOf(ctx context.Context, c *sd.Client, key registry.Key) int {
	return len(listed(ctx, c, key))
}

// listed is what finished operations wrote in key's Cloud Map service
// (ListInstances, which does not lag as DiscoverInstances may); nil when
// it cannot be read.
func listed(ctx context.Context, c *sd.Client, key registry.Key) []recordfmt.Instance {
	svcs, err := c.ListServices(ctx, &sd.ListServicesInput{})
	if err != nil {
		return nil
	}
	for _, s := range svcs.Services {
		if aws.ToString(s.Name) != key.Name {
			continue
		}
		out, err := c.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: s.Id})
		if err != nil {
			return nil
		}
		var instances []recordfmt.Instance
		for _, in := range out.Instances {
			instances = append(instances, recordfmt.Instance{ID: aws.ToString(in.Id), Attrs: in.Attributes})
		}
		return instances
	}
	return nil
}

// One installation rereading its own records reports nothing.
func TestOwnRecordsAreNoDuplicate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	reported := make(chan string, 10)
	b := installation(t, srv, "uid-a", reported)
	heard := make(chan struct{}, 10)
	go func() {
		_ = b.Watch(ctx, registry.SinkFuncs{OnSet: func(registry.Key, []registry.Export) { heard <- struct{}{} }})
	}()
	key := registry.Key{Namespace: "web", Name: "api"}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		if err := publish(ctx, b, export("c1", key, ip)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-heard:
	case <-time.After(20 * time.Second):
		t.Fatal("the watcher never read the export")
	}
	select {
	case other := <-reported:
		t.Fatalf("own records reported as written by %s", other)
	default:
	}
}
