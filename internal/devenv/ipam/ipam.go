package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	devqueue "github.com/clustermap/clustermap/internal/devenv/workqueue"
)

// IPAM assigns pod addresses in one cluster. Pods wait for it: devenv's kwok
// stages make a pod Running only once it has an address.
type IPAM struct {
	cs    kubernetes.Interface
	pods  listersv1.PodLister
	nodes listersv1.NodeLister
	queue workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	held   map[netip.Addr]string   // address -> pod key
	byPod  map[string][]netip.Addr // pod key -> its addresses
	ranges map[string]*Range       // node podCIDR -> its cursor
}

// Run assigns addresses until ctx ends.
func Run(ctx context.Context, cs kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(cs, 0)
	podInf, nodeInf := f.Core().V1().Pods(), f.Core().V1().Nodes()
	m := &IPAM{
		cs: cs, pods: podInf.Lister(), nodes: nodeInf.Lister(),
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		held:   map[netip.Addr]string{},
		byPod:  map[string][]netip.Addr{},
		ranges: map[string]*Range{},
	}
	defer m.queue.ShutDown()
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { m.observe(o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { m.observe(o.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				m.release(key(p))
			}
		},
	}); err != nil {
		return err
	}
	// A pod waiting for a node that appears later.
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			pods, _ := m.pods.List(labels.Everything())
			for _, p := range pods {
				m.observe(p)
			}
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	// Every address already held is known before any is handed out.
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("ipam: %v cache did not sync", typ)
		}
	}
	devqueue.Drain(ctx, m.queue, "assigning pod addresses failed", m.assign)
	return nil
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// observe records the addresses a pod holds, or queues it for some.
func (m *IPAM) observe(p *corev1.Pod) {
	if len(p.Status.PodIPs) == 0 {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			m.queue.Add(key(p))
		}
		return
	}
	if p.Spec.HostNetwork {
		return // the node's addresses, not ours to hold
	}
	k := key(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, known := m.byPod[k]; known {
		return
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			m.held[a] = k
			m.byPod[k] = append(m.byPod[k], a)
		}
	}
}

func (m *IPAM) release(k string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.byPod[k] {
		if m.held[a] == k {
			delete(m.held, a)
		}
	}
	delete(m.byPod, k)
}

// assign gives a pod one address per podCIDR of its node, or the node's
// addresses for a host-network pod, and writes them to the pod's status.
func (m *IPAM) assign(ctx context.Context, k string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(k)
	p, err := m.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(p.Status.PodIPs) > 0 || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		return nil
	}
	node, err := m.nodes.Get(p.Spec.NodeName)
	if err != nil {
		return fmt.Errorf("node %s: %w", p.Spec.NodeName, err)
	}
	var hostIPs []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			hostIPs = append(hostIPs, a.Address)
		}
	}
	var ips []string
	if p.Spec.HostNetwork {
		ips = hostIPs
	} else {
		addrs, err := m.allocate(k, node)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ips = append(ips, a.String())
		}
	}
	if len(ips) == 0 {
		return fmt.Errorf("node %s has no podCIDRs and no InternalIP yet", node.Name)
	}
	if err := m.patch(ctx, p, ips, hostIPs); err != nil {
		if !p.Spec.HostNetwork {
			m.release(k)
		}
		return err
	}
	return nil
}

func (m *IPAM) allocate(k string, node *corev1.Node) ([]netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if addrs, ok := m.byPod[k]; ok {
		return addrs, nil // a failed write is being retried
	}
	taken := func(a netip.Addr) bool { _, ok := m.held[a]; return ok }
	var addrs []netip.Addr
	for _, cidr := range node.Spec.PodCIDRs {
		r := m.ranges[cidr]
		if r == nil {
			prefix, err := netip.ParsePrefix(cidr)
			if err != nil {
				return nil, fmt.Errorf("node %s: podCIDR %q: %w", node.Name, cidr, err)
			}
			if r, err = NewRange(prefix); err != nil {
				return nil, err
			}
			m.ranges[cidr] = r
		}
		a, err := r.Allocate(taken)
		if err != nil {
			for _, b := range addrs {
				delete(m.held, b)
			}
			return nil, err
		}
		m.held[a] = k
		addrs = append(addrs, a)
	}
	m.byPod[k] = addrs
	return addrs, nil
}

func (m *IPAM) patch(ctx context.Context, p *corev1.Pod, ips, hostIPs []string) error {
	st := map[string]any{"podIP": ips[0], "podIPs": ipList(ips)}
	if len(hostIPs) > 0 {
		st["hostIP"], st["hostIPs"] = hostIPs[0], ipList(hostIPs)
	}
	// The uid precondition makes a write for a deleted and recreated pod
	// of the same name fail instead of landing on the new one.
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": p.UID}, "status": st})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = m.cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced: the delete releases, the new pod is queued
	}
	return err
}

func ipList(ips []string) []map[string]string {
	out := make([]map[string]string, len(ips))
	for i, ip := range ips {
		out[i] = map[string]string{"ip": ip}
	}
	return out
}
