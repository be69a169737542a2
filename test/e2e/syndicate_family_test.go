//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// Replication on single-family clusters: each replica has the one slice of
// its cluster's family, with the pods' addresses.
func TestSyndicateFamilies(t *testing.T) {
	inParallel(t)
	for _, fam := range []string{devenv.IPv4, devenv.IPv6} {
		t.Run(fam, func(t *testing.T) {
			w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, IPFamily: fam}})
			w.allNamespaces(t, "web")
			dirs, err := w.env.PeerDirs(context.Background(), t.TempDir(), replication.PeerAccess{Namespaces: []string{"web"}})
			harness.Must(t, err)
			t.Cleanup(w.startControllers(t, func(o *controller.Options) {
				w.asPeer(o, dirs)
				o.MCS, o.Syndicate = false, true
				o.Namespaces = []string{"web"}
			}))
			app(t, w.clients[0], "web", "fam", 2, false, httpPort(80, 8080))
			want := podAddressesByFamily(t, w.clients[0], "web", "fam", 2)
			if len(want) != 1 {
				t.Fatalf("pods of a %s cluster have families %v", fam, want)
			}
			harness.Eventually(t, importDeadline, "the replica's slices", replicaSlices(w.clients[1], "web", "fam", "cluster-1", want))
		})
	}
}

// dualStackReplica: a PreferDualStack Service of dual-stack pods is
// replicated with one slice per family, and its replica is dual-stack too.
func (w *world) dualStackReplica(t *testing.T) {
	ctx := context.Background()
	one, two := w.clients[0], w.clients[1]
	app(t, one, "web", "dual", 2, false, httpPort(80, 8080))
	svc := &corev1.Service{}
	harness.Must(t, one.Get(ctx, client.ObjectKey{Namespace: "web", Name: "dual"}, svc))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	harness.Must(t, one.Update(ctx, svc))
	want := podAddressesByFamily(t, one, "web", "dual", 2)
	if len(want) != 2 {
		t.Fatalf("pods of a dual-stack cluster have families %v", want)
	}
	harness.Eventually(t, importDeadline, "the replica's slices", replicaSlices(two, "web", "dual", "cluster-1", want))
	harness.Eventually(t, importDeadline, "a dual-stack replica", func() error {
		r := &corev1.Service{}
		if err := two.Get(ctx, client.ObjectKey{Namespace: "web", Name: "dual"}, r); err != nil {
			return err
		}
		if len(r.Spec.ClusterIPs) != 2 {
			return fmt.Errorf("replica ClusterIPs %v, want one per family", r.Spec.ClusterIPs)
		}
		return nil
	})
}

// podAddressesByFamily waits for n ready pods of an app and returns their
// addresses (status.podIPs) by family, sorted.
func podAddressesByFamily(t *testing.T, cl client.Client, ns, app string, n int) map[discoveryv1.AddressType][]string {
	t.Helper()
	var out map[discoveryv1.AddressType][]string
	harness.Eventually(t, 30*time.Second, "pods of "+app, func() error {
		pods := &corev1.PodList{}
		if err := cl.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
			return err
		}
		out = map[discoveryv1.AddressType][]string{}
		ready := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.PodIPs) == 0 {
				continue
			}
			ready++
			for _, ip := range p.Status.PodIPs {
				f := discoveryv1.AddressTypeIPv4
				if netip.MustParseAddr(ip.IP).Is6() {
					f = discoveryv1.AddressTypeIPv6
				}
				out[f] = append(out[f], ip.IP)
			}
		}
		if ready != n {
			return fmt.Errorf("%d running pods with addresses, want %d", ready, n)
		}
		for _, ips := range out {
			sort.Strings(ips)
		}
		return nil
	})
	return out
}

// replicaSlices checks that a peer holds, for a replica, exactly one slice
// per wanted family, from the source cluster, with those addresses ready.
func replicaSlices(cl client.Client, ns, name, from string, want map[discoveryv1.AddressType][]string) func() error {
	return func() error {
		list := &discoveryv1.EndpointSliceList{}
		if err := cl.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name, replication.LabelSourceCluster: from}); err != nil {
			return err
		}
		got := map[discoveryv1.AddressType][]string{}
		for _, s := range list.Items {
			if _, dup := got[s.AddressType]; dup {
				return fmt.Errorf("two %s slices", s.AddressType)
			}
			got[s.AddressType] = readyIPs([]discoveryv1.EndpointSlice{s})
		}
		if len(got) != len(want) {
			return fmt.Errorf("slices by family %v, want %v", got, want)
		}
		for f, ips := range want {
			if !slices.Equal(got[f], ips) {
				return fmt.Errorf("slices by family %v, want %v", got, want)
			}
		}
		return nil
	}
}
