package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	// KubeProxy, Clustermap and Self are the kube-proxy, clustermap (its
	// DNS server) and clustermap-dev (the pod servers) binaries.
	KubeProxy, Clustermap, Self string
	// LogDir receives kube-proxy's, the DNS server's and the pods' logs.
	LogDir string
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
	// kube-proxy waits 30 s for a node address before it starts.
	if err := setNodeIPs(ctx, cs, o.Fabric.NodeIPs(idx)); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The node's first simulated node names it to kube-proxy.
	proxyArgs := []string{o.KubeProxy, "--kubeconfig", o.NodeKubeconfig, "--proxy-mode", "nftables",
		"--hostname-override", o.Cluster + "-node-1", "--cluster-cidr", strings.Join(node.PodCIDRs, ","),
		// A namespace cannot change the host's conntrack table size or timeouts.
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--conntrack-udp-timeout", "0", "--conntrack-udp-timeout-stream", "0"}
	dnsArgs := []string{o.Clustermap, "dns", "--kubeconfig", o.NodeKubeconfig, "--listen", ":53", "--health-address", "0"}
	for name, argv := range map[string][]string{"kube-proxy": proxyArgs, "dns": dnsArgs} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keepRunning(ctx, name, filepath.Join(o.LogDir, name+".log"), inNS(ns, argv))
		}()
	}

	// Pod namespaces a previous agent left are rebuilt from the pods.
	for _, p := range Namespaces(ns + "-") {
		if err := DeleteNS(ctx, p); err != nil {
			klog.ErrorS(err, "removing a pod namespace left by an earlier run", "netns", p)
		}
	}
	a := &agent{o: o, node: ns, nodeIdx: idx, pods: map[string]*podRun{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
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
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	devqueue.Drain(ctx, a.queue, "pod data plane failed", a.sync)
	a.stopAll()
	return nil
}

type agent struct {
	o       NodeOptions
	node    string
	nodeIdx int
	lister  listersv1.PodLister
	queue   workqueue.TypedRateLimitingInterface[string]
	pods    map[string]*podRun // by namespace/name; only the worker touches it
}

// podRun is a pod's namespace and its server.
type podRun struct {
	uid  types.UID
	ips  []netip.Addr
	ns   string
	stop context.CancelFunc
	done chan struct{}
}

// Wanted tells whether a pod should have a data plane, and with which addresses.
func Wanted(p *corev1.Pod) ([]netip.Addr, bool) {
	if p == nil || p.DeletionTimestamp != nil || p.Spec.HostNetwork || p.Annotations[Annotation] != "true" {
		return nil, false
	}
	var ips []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a)
		}
	}
	return ips, len(ips) > 0
}

// Ports are the ports a pod's server answers on: its containers' ports,
// or 80/TCP when it declares none.
func Ports(p *corev1.Pod) (tcp, udp []int32) {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			switch port.Protocol {
			case corev1.ProtocolUDP:
				udp = append(udp, port.ContainerPort)
			case corev1.ProtocolSCTP:
			default:
				tcp = append(tcp, port.ContainerPort)
			}
		}
	}
	if len(tcp)+len(udp) == 0 {
		tcp = []int32{80}
	}
	return tcp, udp
}

func (a *agent) sync(ctx context.Context, k string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(k)
	p, err := a.lister.Pods(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if apierrors.IsNotFound(err) {
		p = nil
	}
	ips, want := Wanted(p)
	if run := a.pods[k]; run != nil && (!want || run.uid != p.UID || !slices.Equal(run.ips, ips)) {
		if err := a.stop(ctx, k); err != nil {
			return err
		}
	}
	if !want || a.pods[k] != nil {
		return nil
	}
	return a.start(ctx, k, p, ips)
}

func (a *agent) start(ctx context.Context, k string, p *corev1.Pod, ips []netip.Addr) error {
	pod := a.o.Fabric.PodOf(a.o.Cluster, p.Namespace, p.Name, ips)
	// A namespace of the same name is a former pod's.
	if err := DeleteNS(ctx, pod.NetNS); err != nil {
		return err
	}
	if err := Run(ctx, pod.Steps(a.node)); err != nil {
		_ = DeleteNS(ctx, pod.NetNS)
		return err
	}
	if err := WriteResolvConf(pod.NetNS, a.o.Fabric.ResolvConf(a.nodeIdx, ips)); err != nil {
		return err
	}
	tcp, udp := Ports(p)
	argv := []string{a.o.Self, "podserver", "--pod", p.Name, "--namespace", p.Namespace, "--cluster", a.o.Cluster,
		"--tcp", joinPorts(tcp), "--udp", joinPorts(udp)}
	runCtx, stop := context.WithCancel(context.Background())
	run := &podRun{uid: p.UID, ips: ips, ns: pod.NetNS, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(run.done)
		keepRunning(runCtx, "pod "+k, filepath.Join(a.o.LogDir, "pods.log"), inNS(pod.NetNS, argv))
	}()
	a.pods[k] = run
	klog.InfoS("pod data plane up", "pod", k, "netns", pod.NetNS, "ips", ips)
	return nil
}

func (a *agent) stop(ctx context.Context, k string) error {
	run := a.pods[k]
	run.stop()
	<-run.done
	if err := DeleteNS(ctx, run.ns); err != nil {
		return err
	}
	delete(a.pods, k)
	klog.InfoS("pod data plane down", "pod", k, "netns", run.ns)
	return nil
}

func (a *agent) stopAll() {
	for k := range a.pods {
		if err := a.stop(context.Background(), k); err != nil {
			klog.ErrorS(err, "removing a pod data plane", "pod", k)
		}
	}
}

func joinPorts(ports []int32) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
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

// setNodeIPs gives every simulated node of the cluster the node
// namespace's addresses as InternalIPs, where kwok gives none: they all
// stand for the one node namespace.
func setNodeIPs(ctx context.Context, cs kubernetes.Interface, ips []netip.Addr) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) == 0 {
			klog.InfoS("waiting for the cluster's nodes", "err", err)
			return false, nil
		}
		for _, n := range nodes.Items {
			want := []corev1.NodeAddress{}
			for _, ip := range ips {
				want = append(want, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
			}
			for _, a := range n.Status.Addresses {
				if a.Type != corev1.NodeInternalIP {
					want = append(want, a)
				}
			}
			if slices.Equal(want, n.Status.Addresses) {
				continue
			}
			n.Status.Addresses = want
			if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, &n, metav1.UpdateOptions{}); err != nil {
				klog.InfoS("setting the node's addresses; retrying", "node", n.Name, "err", err)
				return false, nil
			}
		}
		return true, nil
	})
}
