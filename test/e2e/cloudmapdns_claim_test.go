//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/test/harness"
)

// exclusive: in each of 20 rounds, 20 Services in two namespaces of each of
// two clusters are created at once asking for one name; exactly one
// registers, the 19 others report DomainConflict naming it, and Cloud Map
// holds only the winner's instances.
func (d *dnsWorld) exclusive(t *testing.T) {
	ctx := context.Background()
	type racer struct {
		cl       client.Client
		ns, name string
	}
	for _, ns := range []string{"race-a", "race-b"} {
		d.allNamespaces(t, ns)
		for _, cl := range d.clients {
			app(t, cl, ns, "racer", 1, true, httpPort(80, 8080))
		}
	}
	for _, ns := range []string{"race-a", "race-b"} {
		for _, cl := range d.clients {
			waitPods(t, cl, ns, "racer", 1)
		}
	}
	const rounds, services = 20, 20
	for round := range rounds {
		host := fmt.Sprintf("race-%d", round)
		var racers []racer
		for i := range services {
			racers = append(racers, racer{d.clients[i%2], []string{"race-a", "race-b"}[i/2%2], fmt.Sprintf("r%d-%d", round, i)})
		}
		var wg sync.WaitGroup
		for _, r := range racers {
			wg.Go(func() {
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: r.name, Annotations: map[string]string{
						cloudmapdns.AnnotationNamespace: "test-namespace", cloudmapdns.AnnotationHostname: host}},
					Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": "racer"}, Ports: []corev1.ServicePort{httpPort(80, 8080)}}}
				if err := r.cl.Create(ctx, svc); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var winner string
		harness.Eventually(t, importDeadline, host+": one registered, the others in conflict", func() error {
			var won []string
			var conflicts []string
			for _, r := range racers {
				svc := &corev1.Service{}
				if err := r.cl.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: r.name}, svc); err != nil {
					return err
				}
				c := meta.FindStatusCondition(svc.Status.Conditions, cloudmapdns.ConditionRegistered)
				switch {
				case c == nil:
					return fmt.Errorf("%s/%s has no condition yet", r.ns, r.name)
				case c.Reason == cloudmapdns.ReasonRegistered:
					won = append(won, r.ns+"/"+r.name)
				case c.Reason == cloudmapdns.ReasonDomainConflict:
					conflicts = append(conflicts, c.Message)
				default:
					return fmt.Errorf("%s/%s: %s: %s", r.ns, r.name, c.Reason, c.Message)
				}
			}
			if len(won) != 1 {
				return fmt.Errorf("registered: %v", won)
			}
			winner = won[0]
			for _, m := range conflicts {
				if !containsOwner(m, winner) {
					return fmt.Errorf("a conflict names another holder: %q (winner %s)", m, winner)
				}
			}
			// Every instance in Cloud Map is the winner's.
			id := d.lookupService(t, d.privateNS, host)
			if id == "" {
				return fmt.Errorf("no Cloud Map service %s", host)
			}
			cur, err := d.instances(id)
			if err != nil {
				return err
			}
			if len(cur) == 0 {
				return fmt.Errorf("nothing registered in %s", host)
			}
			for _, a := range cur {
				if a[cloudmapdns.AttrNamespace]+"/"+a[cloudmapdns.AttrService] != winner {
					return fmt.Errorf("instance of %s/%s under %s, whose winner is %s", a[cloudmapdns.AttrNamespace], a[cloudmapdns.AttrService], host, winner)
				}
			}
			return nil
		})
		for _, r := range racers {
			harness.Must(t, client.IgnoreNotFound(r.cl.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: r.name}})))
		}
	}
	// Everything the rounds made goes with their Services, locks included.
	harness.Eventually(t, 60*time.Second, "every race Service and Cloud Map service gone", func() error {
		for _, cl := range d.clients {
			for _, ns := range []string{"race-a", "race-b"} {
				list := &corev1.ServiceList{}
				if err := cl.List(ctx, list, client.InNamespace(ns)); err != nil {
					return err
				}
				if len(list.Items) != 1 {
					return fmt.Errorf("%d Services left in %s", len(list.Items)-1, ns)
				}
			}
		}
		var left []string
		for _, s := range d.cloudMapServices(t, d.privateNS) {
			if slices.Contains(raceNames(rounds), s) {
				left = append(left, s)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left in Cloud Map: %v", left)
		}
		return nil
	})
}

func raceNames(rounds int) []string {
	var out []string
	for i := range rounds {
		out = append(out, fmt.Sprintf("race-%d", i), cloudmapdns.LockName(fmt.Sprintf("race-%d", i)))
	}
	return out
}

// containsOwner reports whether a DomainConflict message names the holder
// ns/name (in whichever cluster): "... already claimed by CLUSTER/NS/NAME; ...".
func containsOwner(msg, nsName string) bool {
	return strings.Contains(msg, "/"+nsName+";")
}

func (d *dnsWorld) cloudMapServices(t *testing.T, nsID string) []string {
	t.Helper()
	var names []string
	p := sd.NewListServicesPaginator(d.c, &sd.ListServicesInput{Filters: []sdtypes.ServiceFilter{
		{Name: sdtypes.ServiceFilterNameNamespaceId, Values: []string{nsID}}}})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		harness.Must(t, err)
		for _, s := range page.Services {
			names = append(names, aws.ToString(s.Name))
		}
	}
	sort.Strings(names)
	return names
}

// lostClaim: a holder whose lock is deleted out of band and taken by
// someone else sees it at its next drift check: its instances go and it
// reports DomainConflict; when that lock goes, it takes the name back.
func (d *dnsWorld) lostClaim(t *testing.T) {
	ctx := context.Background()
	cl := d.clients[0]
	id, owner, ips := d.registeredApp(t, cl, "keeper")
	lockID := d.serviceID(t, d.privateNS, cloudmapdns.LockName("keeper"))
	_, err := d.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(lockID)})
	harness.Must(t, err)
	// Taken by another the way clustermap takes one.
	thief, err := cloudmapdns.NewCloudMap(d.c).CreateLock(ctx, d.privateNS, cloudmapdns.LockName("keeper"), "elsewhere/web/keeper")
	harness.Must(t, err)
	harness.Eventually(t, 3*driftPeriod+importDeadline, "the former holder withdrew", d.registered(id, owner, nil, nil))
	harness.Eventually(t, importDeadline, "its conflict", serviceCondition(cl, "web", "keeper", "False/DomainConflict"))
	harness.Eventually(t, 5*time.Second, "its Event", wantEvent(cl, "web", "keeper", "DomainConflict", corev1.EventTypeWarning, "already claimed by elsewhere/web/keeper"))
	_, err = d.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(thief)})
	harness.Must(t, err)
	// Waiters in other clusters poll every 15 s.
	harness.Eventually(t, 20*time.Second+importDeadline, "taken back", d.registered(d.serviceID(t, d.privateNS, "keeper"), owner, ips, nil))
	harness.Eventually(t, importDeadline, "its condition", serviceCondition(cl, "web", "keeper", "True/Registered"))
}

// renamed: the cluster's name falls back to the kube-system UID when its
// ClusterProperty is removed; after a restart the Service keeps its claim,
// its instances are re-registered under the new name and the old ones go,
// and removing its annotations still withdraws everything, lock included.
func (d *dnsWorld) renamed(t *testing.T, restart func()) {
	ctx := context.Background()
	cl := d.clients[0]
	id, oldOwner, ips := d.registeredApp(t, cl, "moved")
	cp := &aboutv1alpha1.ClusterProperty{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, cp))
	harness.Must(t, cl.Delete(ctx, cp))
	t.Cleanup(func() {
		restored := &aboutv1alpha1.ClusterProperty{ObjectMeta: metav1.ObjectMeta{Name: cp.Name}, Spec: cp.Spec}
		if err := cl.Create(ctx, restored); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Error(err)
		}
	})
	restart()
	ks := &corev1.Namespace{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: "kube-system"}, ks))
	newOwner := string(ks.UID) + "/web/moved"
	if newOwner == oldOwner {
		t.Fatalf("owner unchanged: %s", oldOwner)
	}
	harness.Eventually(t, importDeadline, "re-registered under the new name", d.registered(id, newOwner, ips, nil))
	// Then the old instances go: registrations come first, so that the
	// name never goes empty (CloudMap.Apply).
	harness.Eventually(t, importDeadline, "the old instances gone", d.registered(id, oldOwner, nil, nil))
	harness.Eventually(t, importDeadline, "still registered", serviceCondition(cl, "web", "moved", "True/Registered"))
	removeAnnotations(t, cl, "web", "moved", cloudmapdns.AnnotationNamespace, cloudmapdns.AnnotationHostname)
	d.withdrawn(t, cl, "web", "moved", d.privateNS, "moved")
	if id := d.lookupService(t, d.privateNS, cloudmapdns.LockName("moved")); id != "" {
		t.Errorf("the claim made under the old name is still there: %s", id)
	}
}
