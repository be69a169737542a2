//go:build linux && e2e

package devenv_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// 1,000 pods created and deleted over two clusters, at most 50 alive per
// cluster at a time: every pod gets one address per family inside its node's
// ranges, and no address is ever held by two live pods, within a cluster or
// across clusters.
func TestPodAddressesUnderChurn(t *testing.T) {
	const perCluster, window = 500, 50
	env := harness.Clusters(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var mu sync.Mutex
	holder := map[string]types.UID{} // address -> live pod holding it
	assigned := map[types.UID][]string{}
	var errs []string
	fail := func(format string, a ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, a...))
		}
	}

	var wg sync.WaitGroup
	for _, c := range env.Clusters {
		cs := kubernetes.NewForConfigOrDie(c.Config)
		cl := harness.ClientWith(t, c.Config, devenv.Scheme)
		ranges := nodeCIDRs(ctx, t, cl)
		// An informer records who holds what, event by event: it lists and
		// watches again when the server or the connection ends a watch. (A
		// bare watch ends silently then; in one CI run every later pod of
		// one cluster looked addressless, as that would show.)
		inf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace("default"),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "churn=yes" }))
		record := func(p *corev1.Pod) {
			mu.Lock()
			defer mu.Unlock()
			if len(p.Status.PodIPs) == 0 || assigned[p.UID] != nil {
				return
			}
			if err := checkPodIPs(c, p, ranges[p.Spec.NodeName]); err != nil {
				fail("%v", err)
			}
			for _, ip := range p.Status.PodIPs {
				if other, taken := holder[ip.IP]; taken && other != p.UID {
					fail("%s: pod %s got %s, which live pod %s holds", c.ID, p.Name, ip.IP, other)
				}
				holder[ip.IP] = p.UID
				assigned[p.UID] = append(assigned[p.UID], ip.IP)
			}
		}
		if _, err := inf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { record(o.(*corev1.Pod)) },
			UpdateFunc: func(_, o any) { record(o.(*corev1.Pod)) },
			DeleteFunc: func(o any) {
				if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				p, ok := o.(*corev1.Pod)
				if !ok {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, ip := range assigned[p.UID] {
					if holder[ip] == p.UID {
						delete(holder, ip)
					}
				}
			},
		}); err != nil {
			t.Fatal(err)
		}
		inf.Start(ctx.Done())
		inf.WaitForCacheSync(ctx.Done())
		wg.Add(1)
		go func() {
			defer wg.Done()
			churn(ctx, t, cs, c.ID, perCluster, window, func(uid types.UID) bool {
				mu.Lock()
				defer mu.Unlock()
				return assigned[uid] != nil
			})
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, e := range errs {
		t.Error(e)
	}
	if len(assigned) != 2*perCluster {
		t.Errorf("%d pods got addresses, want %d", len(assigned), 2*perCluster)
	}
}

// churn creates n pods, deleting each once it has its addresses and window
// newer ones exist, then deletes the rest.
func churn(ctx context.Context, t *testing.T, cs kubernetes.Interface, id string, n, window int, hasIPs func(types.UID) bool) {
	pods := cs.CoreV1().Pods("default")
	var uids []types.UID
	del := func(i int) {
		for !hasIPs(uids[i]) {
			select {
			case <-ctx.Done():
				t.Errorf("%s: pod churn-%d never got addresses (%s)", id, i, podState(cs, fmt.Sprintf("churn-%d", i)))
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err := pods.Delete(ctx, fmt.Sprintf("churn-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	for i := 0; i < n; i++ {
		p, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("churn-%d", i), Labels: map[string]string{"churn": "yes"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("%s: %v", id, err)
			return
		}
		uids = append(uids, p.UID)
		if i >= window {
			del(i - window)
		}
	}
	for i := max(0, n-window); i < n; i++ {
		del(i)
	}
}

// podState says where a pod got to, for a failure message.
func podState(cs kubernetes.Interface, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("node %q, phase %s, podIPs %v", p.Spec.NodeName, p.Status.Phase, p.Status.PodIPs)
}
