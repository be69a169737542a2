package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/clustermap/clustermap/internal/devenv/supervise"
	devqueue "github.com/clustermap/clustermap/internal/devenv/workqueue"
)

// NodeOptions say what one cluster's node agent runs.
type NodeOptions struct {
	Fabric  Fabric
	Cluster string
	// Kubeconfig reaches the apiserver from the host; NodeKubeconfig from
	// inside the node namespace (through the fabric's uplink).
	Kubeconfig, NodeKubeconfig string
	// KubeProxy, CoreDNS, Clustermap and Self are the kube-proxy, CoreDNS
	// (the cluster's DNS), clustermap (its clusterset DNS server) and
	// clustermap-dev (the pod servers) binaries.
	KubeProxy, CoreDNS, Clustermap, Self string
	// LogDir receives kube-proxy's, the DNS server's and the pods' logs.
	LogDir string
	// AllPods runs every pod (but those on the host's network), not only
	// the annotated ones.
	AllPods bool
}

// RunNode is a cluster's node: in the node namespace it runs kube-proxy
// (nftables) and clustermap's DNS, and it gives every pod that asks for a
// data plane its namespace and a pod server, until ctx ends.
func RunNode(ctx context.Context, cs kubernetes.Interface, o NodeOptions) error {
	idx := o.Fabric.NodeIndex(o.Cluster)
	if idx == 0 {
		return fmt.Errorf("cluster %s is not in the fabric", o.Cluster)
	}
	node := o.Fabric.Nodes[idx-1]
	ns := o.Fabric.NodeNS(o.Cluster)
	if err := WriteResolvConf(ns, "nameserver 127.0.0.1\n"); err != nil {
		return err
	}
	// kube-proxy runs as the first simulated node and waits for its
	// address; the others get theirs as kwok initializes them (below).
	ips := o.Fabric.NodeIPs(idx)
	if err := waitNodeIPs(ctx, cs, o.Cluster+"-node-1", ips); err != nil {
		return fmt.Errorf("giving node %s-node-1 its addresses: %w", o.Cluster, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The node's first simulated node names it to kube-proxy.
	proxyArgs := []string{o.KubeProxy, "--kubeconfig", o.NodeKubeconfig, "--proxy-mode", "nftables",
		"--hostname-override", o.Cluster + "-node-1", "--cluster-cidr", strings.Join(node.PodCIDRs, ","),
		// A namespace cannot change the host's conntrack table size or timeouts.
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--conntrack-udp-timeout", "0", "--conntrack-udp-timeout-stream", "0"}
	dnsArgs := []string{o.Clustermap, "dns", "--kubeconfig", o.NodeKubeconfig, "--listen", ClustermapDNS, "--health-address", "0"}
	corefile := filepath.Join(o.LogDir, "Corefile")
	if err := os.WriteFile(corefile, []byte(Corefile(o.NodeKubeconfig)), 0o644); err != nil {
		return err
	}
	corednsArgs := []string{o.CoreDNS, "-conf", corefile}
	for name, argv := range map[string][]string{"kube-proxy": proxyArgs, "dns": dnsArgs, "coredns": corednsArgs} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keepRunning(ctx, name, filepath.Join(o.LogDir, name+".log"), inNS(ns, argv))
		}()
	}

	// The kubelet API the apiserver proxies exec and logs to, at the port
	// kwok's nodes advertise; every node of the cluster is this namespace.
	port, err := kubeletPort(ctx, cs)
	if err != nil {
		return err
	}
	api, err := apiserverOf(o.NodeKubeconfig)
	if err != nil {
		return fmt.Errorf("the apiserver for the pods: %w", err)
	}
	a := &agent{o: o, cs: cs, node: ns, nodeIdx: idx, api: api, pods: map[string]*podRun{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	kubelet := &Kubelet{Find: a.find, Allowed: o.Fabric.HostAddrs()}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// In the node namespace: the listener belongs to it.
		if err := InNS(ns, func() error { return kubelet.Listen(port) }); err != nil {
			klog.ErrorS(err, "the node's kubelet API cannot listen: kubectl exec and logs fail", "port", port)
			return
		}
		if err := kubelet.Serve(ctx); err != nil {
			klog.ErrorS(err, "the node's kubelet API stopped")
		}
	}()

	// Pod namespaces a previous agent left are rebuilt from the pods.
	for _, p := range Namespaces(ns + "-") {
		if err := DeleteNS(ctx, p); err != nil {
			klog.ErrorS(err, "removing a pod namespace left by an earlier run", "netns", p)
		}
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	inf := f.Core().V1().Pods()
	a.lister = inf.Lister()
	enqueue := func(o any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			a.queue.Add(k)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	onNode := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			// A conflict means a newer version, whose event comes next.
			if _, err := setNodeIPs(ctx, cs, n, ips); err != nil && !apierrors.IsConflict(err) {
				klog.ErrorS(err, "setting a node's addresses", "node", n.Name)
			}
		}
	}
	if _, err := f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onNode, UpdateFunc: func(_, o any) { onNode(o) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	devqueue.Drain(ctx, a.queue, "pod data plane failed", a.sync)
	a.stopAll()
	return nil
}

type agent struct {
	o       NodeOptions
	cs      kubernetes.Interface
	node    string
	nodeIdx int
	api     apiserver
	lister  listersv1.PodLister
	queue   workqueue.TypedRateLimitingInterface[string]
	// pods by namespace/name: the worker changes it, the kubelet API reads it.
	mu   sync.Mutex
	pods map[string]*podRun
}

// inNS is argv run inside network namespace ns.
func inNS(ns string, argv []string) []string {
	return append([]string{IPPath(), "netns", "exec", ns}, argv...)
}

// keepRunning runs argv, appending its output to logPath, and starts it
// again when it exits, until ctx ends. The child dies with the agent
// (parent-death signal), so a killed agent leaves no server behind.
func keepRunning(ctx context.Context, name, logPath string, argv []string) {
	p := &supervise.Process{Name: name, Argv: argv, Log: logPath, Grace: 5 * time.Second,
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		OnExit: func(err error) {
			klog.ErrorS(err, "node process exited; starting it again in a second", "process", name)
		}}
	p.Start()
	<-ctx.Done()
	p.Stop()
}

// kubeletPort is the kubelet port kwok gives the cluster's nodes.
func kubeletPort(ctx context.Context, cs kubernetes.Interface) (int32, error) {
	var port int32
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, n := range nodes.Items {
			if port = n.Status.DaemonEndpoints.KubeletEndpoint.Port; port != 0 {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return 0, fmt.Errorf("no node of the cluster advertises a kubelet port: %w", err)
	}
	return port, nil
}

// NodeAddresses are the addresses a simulated node should have: the node
// namespace's as its InternalIPs, its others kept. update is false while
// kwok has not initialized the node (no Ready condition): a write then
// could race kwok's first status, which would be lost and leave the node
// never Ready.
func NodeAddresses(n *corev1.Node, ips []netip.Addr) (want []corev1.NodeAddress, update bool) {
	if !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }) {
		return nil, false
	}
	for _, ip := range ips {
		want = append(want, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			want = append(want, a)
		}
	}
	return want, !slices.Equal(want, n.Status.Addresses)
}

// setNodeIPs gives a simulated node the node namespace's addresses once
// kwok has initialized it; false when it is not there yet.
func setNodeIPs(ctx context.Context, cs kubernetes.Interface, n *corev1.Node, ips []netip.Addr) (bool, error) {
	want, update := NodeAddresses(n, ips)
	if !update {
		return want != nil, nil
	}
	n = n.DeepCopy()
	n.Status.Addresses = want
	_, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	return err == nil, err
}

// waitNodeIPs waits until the named node has the node namespace's
// addresses: kube-proxy, which runs as that node, waits 30 s for one.
func waitNodeIPs(ctx context.Context, cs kubernetes.Interface, name string, ips []netip.Addr) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			klog.InfoS("waiting for the node", "node", name, "err", err)
			return false, nil
		}
		done, err := setNodeIPs(ctx, cs, n, ips)
		if err != nil {
			klog.InfoS("setting the node's addresses; retrying", "node", name, "err", err)
		}
		return done, nil
	})
}
