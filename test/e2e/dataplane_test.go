//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// unexportBound is how long requests may go on succeeding after the last
// export of a service ends: the importing controller's poll (500 ms here),
// the import's removal, kube-proxy's resync of the derived Service (it
// batches changes for up to a second) and the DNS TTL (5 s) for new names.
const unexportBound = 20 * time.Second

// TestDataplane judges connectivity and DNS between clusters with standard
// tools, as an outside suite would: a plain client pod of cluster-2 (a
// sleep loop) runs nc, nslookup and dig through kubectl exec; socat
// listeners in the pods answer with their own name and addresses. Every
// pod runs (--all-pods): none carries an annotation.
func TestDataplane(t *testing.T) {
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, Dataplane: true, AllPods: true}, Controllers: true})
	// Beside MCS, replication of one namespace between the same clusters.
	const ns = "dp"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
		namespace(t, cl, "dp-syn")
	}
	dirs, err := w.env.PeerDirs(context.Background(), t.TempDir(), replication.PeerAccess{Namespaces: []string{"dp-syn"}})
	harness.Must(t, err)
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		w.asPeer(o, dirs)
		o.MCS, o.Syndicate, o.CreateNamespaces, o.Namespaces = false, true, false, []string{"dp-syn"}
	}))
	d := &dpWorld{world: w, at: w.env.Clusters[1], ns: ns, client: clientPod(t, w, 1, ns, nil)}
	t.Run("exec runs in the pod, with its network and DNS", d.execSession)
	t.Run("exec -t gets a terminal", d.terminalSession)
	t.Run("pods run their commands as their spec says", d.processes)
	t.Run("pods reach their apiserver as their service account", d.serviceAccount)
	t.Run("only the exporting cluster answers, then both", d.exporters)
	t.Run("each port reaches the cluster defining it", d.ports)
	t.Run("headless per-pod names reach their pods", d.headless)
	t.Run("an unexported Service is unreachable", d.unexported)
	t.Run("syndicate replicas carry traffic", d.replica)
}

// TestDataplaneIPv6Only: IPv6-only clusters, whose pods run because they
// are annotated (the default).
func TestDataplaneIPv6Only(t *testing.T) {
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, Dataplane: true, IPFamily: devenv.IPv6}, Controllers: true})
	const ns, name = "dp6", "web"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
	}
	d := &dpWorld{world: w, at: w.env.Clusters[1], ns: ns, client: clientPod(t, w, 1, ns, onDataplane)}
	listener(t, d.clients[0], ns, name, 2, 42, onDataplane)
	exportService(t, d.clients[0], ns, name)
	host := name + "." + ns + ".svc.clusterset.local"
	for _, proto := range []string{"tcp", "udp"} {
		d.untilAnswered(t, proto, []string{"-6"}, host, 42, "cluster-1")
	}
	ips := d.importIPs(t, ns, name)
	if got := d.lookup(t, "dig", "AAAA", host); !slices.Equal(got, ips) {
		t.Errorf("dig AAAA %s: %v, want the import's %v", host, got, ips)
	}
	if got := d.lookup(t, "dig", "A", host); len(got) != 0 {
		t.Errorf("dig A %s in an IPv6-only clusterset: %v", host, got)
	}
	// The apiserver over IPv6, as the pod's service account.
	out, err := d.exec("kubectl auth whoami -o jsonpath='{.status.userInfo.username}'")
	if err != nil || out != "system:serviceaccount:dp6:default" {
		t.Errorf("kubectl in an IPv6-only pod: %q %v", out, err)
	}
}

// onDataplane asks for a pod's network and processes where the cluster
// does not run every pod.
var onDataplane = map[string]string{dataplane.Annotation: "true"}

type dpWorld struct {
	*world
	// client is a client pod of cluster at, in namespace ns.
	at         *devenv.Cluster
	ns, client string
}

// clientPod starts a plain client pod in cluster i, a sleep loop that logs
// its name first, and returns its name once it is Ready.
func clientPod(t *testing.T, w *world, i int, ns string, annotations map[string]string) string {
	t.Helper()
	harness.Must(t, w.clients[i].Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client", Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "client", Image: "busybox",
			Command: []string{"sh", "-c", `echo "client $MY_POD_NAME up"; while true; do sleep 3600; done`},
			Env:     []corev1.EnvVar{{Name: "MY_POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		}}},
	}))
	waitPodReady(t, w.clients[i], ns, "client")
	return "client"
}

func waitPodReady(t *testing.T, cl client.Client, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	harness.Eventually(t, time.Minute, "pod "+ns+"/"+name+" Ready", func() error {
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
			return err
		}
		if !podReady(pod) {
			return fmt.Errorf("phase %s, conditions %v", pod.Status.Phase, pod.Status.Conditions)
		}
		return nil
	})
	return pod
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// listenerPods is the pod template of socat listeners on TCP and UDP port,
// answering each connection or datagram with "pod <name> ips <addresses>".
func listenerPods(name string, port int32, annotations map[string]string) corev1.PodTemplateSpec {
	// The request's line is read before the answer: closing with it unread
	// would reset the connection, and a reset can discard the answer
	// before the client reads it.
	answer := `SYSTEM:'read -r line; echo "$ANSWER"'`
	// UDP: RECVFROM, not LISTEN. With fork, UDP-LISTEN hands its socket,
	// connected to the first peer, to the child and binds a new one: a
	// datagram arriving before the parent has bound again finds no socket
	// and is lost (one request in about 13 runs of ten, under load).
	// RECVFROM keeps the socket bound and hands each datagram to a child
	// that answers through it.
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "socat", Image: "alpine/socat",
			Command: []string{"sh", "-c", fmt.Sprintf("socat TCP6-LISTEN:%[1]d,ipv6only=0,fork,reuseaddr %[2]s & socat UDP6-RECVFROM:%[1]d,ipv6only=0,fork,reuseaddr %[2]s & wait", port, answer)},
			Env: []corev1.EnvVar{
				{Name: "MY_POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "MY_POD_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
				{Name: "ANSWER", Value: "pod $(MY_POD_NAME) ips $(MY_POD_IPS)"},
			},
			Ports: []corev1.ContainerPort{{Name: "tcp", ContainerPort: port}, {Name: "udp", ContainerPort: port, Protocol: corev1.ProtocolUDP}},
		}}},
	}
}

// listenerPorts are a listener Service's ports: tcp and udp, both port.
func listenerPorts(port int32) []corev1.ServicePort {
	return []corev1.ServicePort{
		{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(port)},
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: port, TargetPort: intstr.FromInt32(port)},
	}
}

// listener creates a Deployment of socat listeners and a Service of them.
func listener(t *testing.T, cl client.Client, ns, name string, replicas, port int32, annotations map[string]string) {
	t.Helper()
	labels := map[string]string{"app": name}
	harness.Must(t, cl.Create(context.Background(), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: listenerPods(name, port, annotations)}}))
	harness.Must(t, cl.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: listenerPorts(port), IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack)}}))
}

// answer is who answered a request: a pod, and the cluster whose pod
// range holds the address it printed.
type answer struct{ pod, cluster string }

func (d *dpWorld) answerOf(out string) (answer, error) {
	f := strings.Fields(out)
	if len(f) != 4 || f[0] != "pod" || f[2] != "ips" {
		return answer{}, fmt.Errorf("not a listener's answer: %q", out)
	}
	ip, err := netip.ParseAddr(strings.Split(f[3], ",")[0])
	if err != nil {
		return answer{}, fmt.Errorf("answer %q: %v", out, err)
	}
	for _, c := range d.env.Clusters {
		for _, cidr := range c.PodCIDRs {
			if netip.MustParsePrefix(cidr).Contains(ip) {
				return answer{pod: f[1], cluster: c.ID}, nil
			}
		}
	}
	return answer{}, fmt.Errorf("answer %q: %s is in no cluster's pod range", out, ip)
}

// exec runs a shell command in the client pod with kubectl exec.
func (d *dpWorld) exec(script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return harness.Exec(ctx, d.env, d.at, d.ns, d.client, "sh", "-c", script)
}

// nc sends "hi" to host:port over proto (tcp or udp) with nc, flags added
// (-4, -6), from the client pod, and returns who answered.
func (d *dpWorld) nc(proto string, flags []string, host string, port int32) (answer, error) {
	if proto == "udp" {
		// Done at the first datagram back, not after -w's idle time.
		flags = append(flags, "-u", "-W", "1")
	}
	// -w 5: the listeners fork a shell per request, which a loaded machine
	// can take over 2 s to run; nc then prints nothing.
	out, err := d.exec(fmt.Sprintf("echo hi | nc %s -w 5 %s %d", strings.Join(flags, " "), host, port))
	if err != nil {
		return answer{}, err
	}
	return d.answerOf(strings.TrimSpace(out))
}

// untilAnswered asks until every cluster of want has answered, failing at
// once on an answer from any other.
func (d *dpWorld) untilAnswered(t *testing.T, proto string, flags []string, host string, port int32, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	what := fmt.Sprintf("answers from %s at %s:%d/%s %v", strings.Join(want, ","), host, port, proto, flags)
	harness.Eventually(t, time.Minute, what, func() error {
		a, err := d.nc(proto, flags, host, port)
		if err != nil {
			return err
		}
		if !slices.Contains(want, a.cluster) {
			t.Fatalf("%s:%d/%s answered from %s, which does not export it", host, port, proto, a.cluster)
		}
		seen[a.cluster] = true
		for _, c := range want {
			if !seen[c] {
				return fmt.Errorf("no answer from %s yet (seen %v)", c, slices.Sorted(maps.Keys(seen)))
			}
		}
		return nil
	})
}

// answering asks n times and returns the clusters that answered; every
// request must be answered.
func (d *dpWorld) answering(t *testing.T, n int, proto string, host string, port int32) []string {
	t.Helper()
	got, err := d.ask(n, proto, host, port)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// ask asks n times and returns the clusters that answered, or the first
// request that was not answered.
func (d *dpWorld) ask(n int, proto string, host string, port int32) ([]string, error) {
	seen := map[string]bool{}
	for i := range n {
		a, err := d.nc(proto, nil, host, port)
		if err != nil {
			return nil, fmt.Errorf("request %d of %d to %s:%d/%s: %v", i+1, n, host, port, proto, err)
		}
		seen[a.cluster] = true
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// lookup asks the client pod's DNS with dig +short (or nslookup) and
// returns the answers, sorted.
func (d *dpWorld) lookup(t *testing.T, tool, qtype, name string) []string {
	t.Helper()
	script := fmt.Sprintf("dig +short %s %s", qtype, name)
	if tool == "nslookup" {
		script = fmt.Sprintf("nslookup -type=%s %s", qtype, name)
	}
	out, err := d.exec(script)
	if err != nil && tool == "dig" {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, ";;"):
		case tool == "dig":
			got = append(got, line)
		case strings.HasPrefix(line, "Address:") && !strings.Contains(line, "#"):
			got = append(got, strings.TrimSpace(strings.TrimPrefix(line, "Address:")))
		case strings.Contains(line, "service = "):
			got = append(got, strings.TrimSpace(strings.SplitN(line, "service = ", 2)[1]))
		}
	}
	slices.Sort(got)
	return got
}

// importIPs waits for the client's cluster to import a service and
// returns its clusterset IPs, sorted.
func (d *dpWorld) importIPs(t *testing.T, ns, name string) []string {
	t.Helper()
	si := &mcsv1beta1.ServiceImport{}
	harness.Eventually(t, importDeadline, "the import of "+ns+"/"+name, func() error {
		if err := d.clients[1].Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, si); err != nil {
			return err
		}
		if len(si.Spec.IPs) == 0 {
			return errors.New("no clusterset IP yet")
		}
		return nil
	})
	return slices.Sorted(slices.Values(si.Spec.IPs))
}

// exec: kubectl exec and client-go's executor run commands in the pod's
// network namespace with its resolv.conf, passing stdin, stdout, stderr
// and the exit code; kubectl logs shows the container's output.
func (d *dpWorld) execSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod := &corev1.Pod{}
	harness.Must(t, d.clients[1].Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.client}, pod))

	out, err := d.exec("cat /etc/resolv.conf; ip -o addr show dev eth0")
	harness.Must(t, err)
	for _, want := range []string{"search dp.svc.cluster.local svc.cluster.local cluster.local", "options ndots:5"} {
		if !strings.Contains(out, want) {
			t.Errorf("the pod's resolv.conf lacks %q:\n%s", want, out)
		}
	}
	for _, ip := range pod.Status.PodIPs {
		if !strings.Contains(out, " "+ip.IP+"/") {
			t.Errorf("eth0 in the exec session lacks the pod's address %s:\n%s", ip.IP, out)
		}
	}
	// Every simulated node is the node namespace, at its fabric address:
	// where the apiserver reaches the node's kubelet API.
	nodes := &corev1.NodeList{}
	harness.Must(t, d.clients[1].List(ctx, nodes))
	for _, n := range nodes.Items {
		if !slices.ContainsFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool {
			return a.Type == corev1.NodeInternalIP && strings.HasPrefix(a.Address, "198.18.")
		}) {
			t.Errorf("node %s has no fabric address: %v", n.Name, n.Status.Addresses)
		}
	}
	// The cluster's own names resolve, short and long.
	kube := &corev1.Service{}
	harness.Must(t, d.clients[1].Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, kube))
	if got := d.lookup(t, "nslookup", "A", "kubernetes.default"); !slices.Contains(got, kube.Spec.ClusterIP) {
		t.Errorf("nslookup kubernetes.default: %v, want %s", got, kube.Spec.ClusterIP)
	}

	// kubectl exec -i: stdin in, stdout and stderr apart, the exit code out.
	script := `read line; echo "got $line"; echo "to stderr" >&2; exit 7`
	stdout, stderr, err := harness.Kubectl(ctx, d.env, d.at, strings.NewReader("hello\n"), "exec", "-i", "-n", d.ns, d.client, "--", "sh", "-c", script)
	var exitErr interface{ ExitCode() int }
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 7 || stdout != "got hello\n" || !strings.Contains(stderr, "to stderr") {
		t.Errorf("kubectl exec -i: err %v stdout %q stderr %q; want exit 7, got hello, to stderr", err, stdout, stderr)
	}
	// Each protocol alone, with no fallback to the other, so each is proved.
	for _, proto := range []string{devenv.WebSocket, devenv.SPDY} {
		stdout, stderr, err := devenv.PodExec(ctx, d.at, proto, d.ns, d.client, "client", strings.NewReader("hello\n"), "sh", "-c", script)
		var code utilexec.ExitError
		if !errors.As(err, &code) || code.ExitStatus() != 7 || stdout != "got hello\n" || stderr != "to stderr\n" {
			t.Errorf("client-go exec over %s: err %v stdout %q stderr %q; want exit 7, got hello, to stderr", proto, err, stdout, stderr)
		}
	}
	if out, _, err := harness.Kubectl(ctx, d.env, d.at, nil, "logs", "-n", d.ns, d.client); err != nil || out != "client client up\n" {
		t.Errorf("kubectl logs: %q %v, want the client's first line", out, err)
	}
}

// processes: restartPolicy, Ready only once the declared port listens,
// processes gone with their pod.
func (d *dpWorld) processes(t *testing.T) {
	ctx := context.Background()
	cl := d.clients[1]
	dir := t.TempDir() // the pods' processes share the host's files
	script := func(name, body string) corev1.Container {
		return corev1.Container{Name: "main", Image: "busybox", Command: []string{"sh", "-c", body}, WorkingDir: dir,
			Env: []corev1.EnvVar{{Name: "NAME", Value: name}}}
	}
	pod := func(name string, policy corev1.RestartPolicy, c corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
			Spec: corev1.PodSpec{RestartPolicy: policy, Containers: []corev1.Container{c}}}
	}
	// Fails twice, then succeeds: OnFailure restarts it until it does.
	harness.Must(t, cl.Create(ctx, pod("flaky", corev1.RestartPolicyOnFailure,
		script("flaky", `echo run >> $NAME.runs; [ $(wc -l < $NAME.runs) -ge 3 ] && exit 0; exit 3`))))
	// Fails once: Never leaves it failed.
	harness.Must(t, cl.Create(ctx, pod("once", corev1.RestartPolicyNever, script("once", `echo "bye from $PWD"; exit 5`))))
	// Declares port 42 but listens only once the gate file appears.
	gated := script("gated", `echo waiting; while [ ! -e gate ]; do sleep 0.1; done; exec socat TCP-LISTEN:42,fork,reuseaddr SYSTEM:'read -r line; echo open'`)
	gated.Ports = []corev1.ContainerPort{{ContainerPort: 42}}
	harness.Must(t, cl.Create(ctx, pod("gated", corev1.RestartPolicyAlways, gated)))

	final := func(name string, phase corev1.PodPhase) *corev1.Pod { return d.podIn(t, cl, name, phase) }
	if p := final("flaky", corev1.PodSucceeded); p.Status.ContainerStatuses[0].RestartCount != 2 {
		t.Errorf("flaky restarted %d times, want 2", p.Status.ContainerStatuses[0].RestartCount)
	}
	p := final("once", corev1.PodFailed)
	if st := p.Status.ContainerStatuses[0]; st.RestartCount != 0 || st.State.Terminated == nil || st.State.Terminated.ExitCode != 5 {
		t.Errorf("once: %+v, want exit 5 and no restart", st)
	}
	if out, _, err := harness.Kubectl(ctx, d.env, d.at, nil, "logs", "-n", d.ns, "once"); err != nil || out != "bye from "+dir+"\n" {
		t.Errorf("kubectl logs once: %q %v", out, err)
	}

	// Running, not listening: not Ready, however long it waits.
	harness.Eventually(t, time.Minute, "gated running", func() error {
		if err := cl.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: "gated"}, p); err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			return errors.New("not running yet")
		}
		return nil
	})
	if out, _, _ := harness.Kubectl(ctx, d.env, d.at, nil, "logs", "-n", d.ns, "gated"); out != "waiting\n" {
		t.Fatalf("gated logs %q: its process should be waiting", out)
	}
	if podReady(p) {
		t.Fatal("gated is Ready before its port listens")
	}
	harness.Must(t, os.WriteFile(filepath.Join(dir, "gate"), nil, 0o644))
	p = waitPodReady(t, cl, d.ns, "gated")
	// The gated listener reads the request's line before it answers, as
	// listenerPods do: closed with it unread, the connection is reset,
	// and the reset can discard "open" before nc reads it (nc then
	// prints nothing and exits 0; seen under load). -w 10: socat forks a
	// shell per connection, slow on a loaded machine.
	if out, err := d.exec("echo | nc -w 10 " + p.Status.PodIP + " 42"); err != nil || strings.TrimSpace(out) != "open" {
		t.Errorf("gated is Ready; its port answered %q %v", out, err)
	}

	// Deleted, its processes end: none is left working in dir.
	if len(processesIn(dir)) == 0 {
		t.Fatalf("no process works in %s while gated runs", dir)
	}
	harness.Must(t, cl.Delete(ctx, p))
	harness.Eventually(t, time.Minute, "gated's processes gone", func() error {
		if pids := processesIn(dir); len(pids) > 0 {
			return fmt.Errorf("processes %v still work in %s", pids, dir)
		}
		return nil
	})
}

// serviceAccount: a pod's processes and exec sessions find their service
// account's token where client-go's in-cluster configuration reads it, and
// reach the apiserver with it, as kubectl in a pod does; a pod that opts
// out has no token.
func (d *dpWorld) serviceAccount(t *testing.T) {
	ctx := context.Background()
	cl := d.clients[1]
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "reader"}}
	harness.Must(t, cl.Create(ctx, sa))
	// Each pod has a HOME of its own in the lab's directory: no
	// kubeconfig to find there but the in-cluster one, and kubectl's cache
	// stays in the lab, not on the host.
	whoami := func(name, account string, automount *bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: account, AutomountServiceAccountToken: automount,
				Containers: []corev1.Container{{Name: "main", Image: "bitnami/kubectl",
					Command: []string{"sh", "-c", `ls ` + dataplane.ServiceAccountDir + `; kubectl auth whoami -o jsonpath='{.status.userInfo.username}'`}}}}}
	}
	harness.Must(t, cl.Create(ctx, whoami("as-reader", "reader", nil)))
	harness.Must(t, cl.Create(ctx, whoami("no-token", "reader", ptr.To(false))))
	logs := func(name string, phase corev1.PodPhase) string {
		d.podIn(t, cl, name, phase)
		out, _, err := harness.Kubectl(ctx, d.env, d.at, nil, "logs", "-n", d.ns, name)
		harness.Must(t, err)
		return out
	}
	if out := logs("as-reader", corev1.PodSucceeded); out != "ca.crt\nnamespace\ntoken\nsystem:serviceaccount:dp:reader" {
		t.Errorf("a pod of service account reader printed %q", out)
	}
	if out := logs("no-token", corev1.PodFailed); strings.Contains(out, "token") || strings.Contains(out, "system:serviceaccount") {
		t.Errorf("a pod without automounted token printed %q", out)
	}
	out, err := d.exec("kubectl auth whoami -o jsonpath='{.status.userInfo.username}'")
	if err != nil || out != "system:serviceaccount:dp:default" {
		t.Errorf("kubectl in an exec session of the client pod: %q %v", out, err)
	}
	home, err := d.exec(`echo "$HOME"; ls "$HOME/.kube"`)
	if dir, _, _ := strings.Cut(home, "\n"); err != nil || !strings.HasPrefix(dir, d.env.StateDir+"/") || !strings.Contains(home, "cache") {
		t.Errorf("the client pod's HOME: %q %v; want a directory under the lab's %s, holding kubectl's cache", home, err, d.env.StateDir)
	}
}

// podIn waits until pod name of d's namespace in cl is in phase.
func (d *dpWorld) podIn(t *testing.T, cl client.Client, name string, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	harness.Eventually(t, time.Minute, name+" "+string(phase), func() error {
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: name}, p); err != nil {
			return err
		}
		if p.Status.Phase != phase {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	return p
}

// processesIn lists the processes whose working directory is dir.
func processesIn(dir string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func (d *dpWorld) exporters(t *testing.T) {
	const name = "web"
	host := name + "." + d.ns + ".svc.clusterset.local"
	// The same Service in both clusters, the client's included; only
	// cluster-1 exports it.
	for _, cl := range d.clients {
		listener(t, cl, d.ns, name, 2, 42, nil)
		requireDualStack(t, cl, d.ns, name)
	}
	exportService(t, d.clients[0], d.ns, name)
	for _, proto := range []string{"tcp", "udp"} {
		for _, fam := range []string{"-4", "-6"} {
			d.untilAnswered(t, proto, []string{fam}, host, 42, "cluster-1")
		}
	}
	if got := d.answering(t, 10, "tcp", host, 42); !slices.Equal(got, []string{"cluster-1"}) {
		t.Fatalf("answers from %v, want cluster-1 only, 10 times out of 10", got)
	}

	// DNS: the clusterset IPs (A and AAAA), SRV per named port.
	ips := d.importIPs(t, d.ns, name)
	var v4, v6 []string
	for _, ip := range ips {
		if strings.Contains(ip, ":") {
			v6 = append(v6, ip)
		} else {
			v4 = append(v4, ip)
		}
	}
	for _, tool := range []string{"dig", "nslookup"} {
		if got := d.lookup(t, tool, "A", host); !slices.Equal(got, v4) {
			t.Errorf("%s A %s: %v, want %v", tool, host, got, v4)
		}
		if got := d.lookup(t, tool, "AAAA", host); !slices.Equal(got, v6) {
			t.Errorf("%s AAAA %s: %v, want %v", tool, host, got, v6)
		}
	}
	for _, proto := range []string{"tcp", "udp"} {
		srv := fmt.Sprintf("_%s._%s.%s", proto, proto, host)
		want := []string{"0 10 42 " + host + "."}
		if got := d.lookup(t, "dig", "SRV", srv); !slices.Equal(got, want) {
			t.Errorf("dig SRV %s: %v, want %v", srv, got, want)
		}
		if got := d.lookup(t, "nslookup", "SRV", srv); !slices.Equal(got, want) {
			t.Errorf("nslookup SRV %s: %v, want %v", srv, got, want)
		}
	}

	exportService(t, d.clients[1], d.ns, name)
	d.untilAnswered(t, "tcp", nil, host, 42, "cluster-1", "cluster-2")

	start := time.Now()
	for _, cl := range d.clients {
		harness.Must(t, cl.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name}}))
	}
	harness.Eventually(t, unexportBound, "requests to an unexported service fail", func() error {
		if a, err := d.nc("tcp", nil, host, 42); err == nil {
			return fmt.Errorf("still answered by %v", a)
		}
		return nil
	})
	t.Logf("requests stopped %v after the exports ended", time.Since(start).Round(100*time.Millisecond))
}

// requireDualStack gives a Service an address of each family.
func requireDualStack(t *testing.T, cl client.Client, ns, name string) {
	t.Helper()
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = nil
	harness.Must(t, cl.Update(context.Background(), svc))
}

// ports: the same port names with other numbers in each cluster. The
// oldest export's definition (cluster-1's 42) is the import's; it reaches
// cluster-1 only, and cluster-2's 43 is not the import's port at all.
func (d *dpWorld) ports(t *testing.T) {
	const name = "multi"
	host := name + "." + d.ns + ".svc.clusterset.local"
	listener(t, d.clients[0], d.ns, name, 1, 42, nil)
	exportService(t, d.clients[0], d.ns, name)
	d.importIPs(t, d.ns, name)
	listener(t, d.clients[1], d.ns, name, 1, 43, nil)
	exportService(t, d.clients[1], d.ns, name)
	harness.Eventually(t, importDeadline, "cluster-2's export in the import", func() error {
		si := &mcsv1beta1.ServiceImport{}
		if err := d.clients[1].Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: name}, si); err != nil {
			return err
		}
		if len(si.Status.Clusters) != 2 {
			return fmt.Errorf("clusters %v", si.Status.Clusters)
		}
		return nil
	})
	d.untilAnswered(t, "tcp", nil, host, 42, "cluster-1")
	for _, proto := range []string{"tcp", "udp"} {
		if got := d.answering(t, 10, proto, host, 42); !slices.Equal(got, []string{"cluster-1"}) {
			t.Errorf("port 42/%s answered from %v, want cluster-1 only, 10 times out of 10", proto, got)
		}
	}
	if a, err := d.nc("tcp", nil, host, 43); err == nil {
		t.Errorf("port 43, which lost its conflict, answered from %v", a)
	}
}

func (d *dpWorld) headless(t *testing.T) {
	const name = "db"
	labels := map[string]string{"app": name}
	src := d.clients[0]
	harness.Must(t, src.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: listenerPorts(42),
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack)}}))
	harness.Must(t, src.Create(context.Background(), &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), ServiceName: name, Selector: &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.ParallelPodManagement, Template: listenerPods(name, 42, nil)}}))
	exportService(t, src, d.ns, name)
	for _, pod := range []string{"db-0", "db-1"} {
		host := pod + ".cluster-1." + name + "." + d.ns + ".svc.clusterset.local"
		harness.Eventually(t, time.Minute, host+" answers", func() error {
			a, err := d.nc("tcp", nil, host, 42)
			if err == nil && (a.pod != pod || a.cluster != "cluster-1") {
				t.Fatalf("%s answered from %v", host, a)
			}
			return err
		})
		p := &corev1.Pod{}
		harness.Must(t, src.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: pod}, p))
		// One family's endpoints may reach the import before the other's
		// (the exporter publishes what its slices hold): each is awaited.
		harness.Eventually(t, 30*time.Second, "dig A "+host, func() error {
			if got := d.lookup(t, "dig", "A", host); !slices.Equal(got, []string{p.Status.PodIPs[0].IP}) {
				return fmt.Errorf("%v, want %s", got, p.Status.PodIPs[0].IP)
			}
			return nil
		})
		harness.Eventually(t, 30*time.Second, "nslookup AAAA "+host, func() error {
			if got := d.lookup(t, "nslookup", "AAAA", host); !slices.Equal(got, []string{p.Status.PodIPs[1].IP}) {
				return fmt.Errorf("%v, want %s", got, p.Status.PodIPs[1].IP)
			}
			return nil
		})
	}
}

// replica: a Service of cluster-1 replicated by syndicate answers at its
// replica's own name in cluster-2 (cluster.local).
func (d *dpWorld) replica(t *testing.T) {
	const ns, name = "dp-syn", "api"
	listener(t, d.clients[0], ns, name, 2, 42, nil)
	d.untilAnswered(t, "tcp", nil, name+"."+ns+".svc.cluster.local", 42, "cluster-1")
}

func (d *dpWorld) unexported(t *testing.T) {
	const name = "hidden"
	listener(t, d.clients[0], d.ns, name, 1, 42, nil)
	svc := &corev1.Service{}
	harness.Eventually(t, time.Minute, "the hidden Service's pods ready", func() error {
		if err := d.clients[0].Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: name}, svc); err != nil {
			return err
		}
		ips, err := readyPodIPs(d.clients[0], d.ns, name)
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("no ready pods")
		}
		return err
	})
	host := name + "." + d.ns + ".svc.clusterset.local"
	if out, err := d.exec("nslookup " + host); err == nil || !strings.Contains(out, "NXDOMAIN") {
		t.Errorf("nslookup %s: %v\n%s\nwant NXDOMAIN", host, err, out)
	}
	// Neither by name nor by cluster-1's own ClusterIP: a cluster's
	// Service range is its own.
	for _, h := range []string{host, svc.Spec.ClusterIP} {
		if a, err := d.nc("tcp", nil, h, 42); err == nil {
			t.Errorf("%s answered from %v", h, a)
		}
	}
}
