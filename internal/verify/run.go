package verify

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/probe"
)

// Options of a run.
type Options struct {
	// Namespace made (and deleted) in every cluster; "" for a new
	// clustermap-verify-<random> one.
	Namespace string
	// Image of the probe: clustermap's, which serves as server and client.
	Image string
	Zone  string
	// Wait bounds how long the probes may take to run and be imported
	// everywhere; checks run then with what there is.
	Wait time.Duration
	// Keep leaves the namespaces in place (to look at what failed).
	Keep bool
	Log  func(format string, args ...any)
}

// Target is a cluster to verify.
type Target struct {
	Context string
	Config  *rest.Config
}

type member struct {
	Cluster
	cl  client.Client
	cs  kubernetes.Interface
	cfg *rest.Config
	// made: the namespace is this run's, to delete.
	made bool
}

// Run deploys a probe in every cluster, waits for each to be imported
// everywhere, checks from every cluster, and deletes what it made
// whatever happens (unless o.Keep).
func Run(ctx context.Context, targets []Target, o Options) (Report, error) {
	if o.Namespace == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		o.Namespace = "clustermap-verify-" + hex.EncodeToString(b)
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	rep := Report{Namespace: o.Namespace}
	var ms []*member
	for _, t := range targets {
		// Named by its context until its id is read.
		m := &member{Cluster: Cluster{Context: t.Context, ID: t.Context}, cfg: t.Config}
		ms = append(ms, m)
		var err error
		if m.cl, err = client.New(t.Config, client.Options{Scheme: kube.Scheme()}); err == nil {
			m.cs, err = kubernetes.NewForConfig(t.Config)
		}
		if err != nil {
			m.Error = err.Error()
			continue
		}
		id, err := clusterid.Read(ctx, m.cl)
		if err != nil {
			m.Error = err.Error()
			continue
		}
		m.ID = id.ClusterID
	}
	if ids := idsOf(ms); len(ids) != len(slices.Compact(slices.Sorted(slices.Values(ids)))) {
		return rep, fmt.Errorf("two contexts reach clusters with the same id (%v): pass each cluster once", ids)
	}
	defer func() {
		if o.Keep {
			o.Log("keeping namespace %s in every cluster", o.Namespace)
			return
		}
		cleanup(context.WithoutCancel(ctx), ms, o)
	}()
	for _, m := range ms {
		if m.Error == "" {
			if err := deploy(ctx, m, o); err != nil {
				m.Error = "deploying the probe: " + err.Error()
			}
		}
	}
	o.Log("probes deployed in namespace %s; waiting for them to run and be imported everywhere", o.Namespace)
	settle(ctx, ms, o)
	var notRun []Failure
	for _, m := range ms {
		rep.Clusters = append(rep.Clusters, m.Cluster)
		if m.Error != "" {
			notRun = append(notRun, Failure{From: m.ID, To: m.ID, What: "the probe", Got: m.Error,
				Cause: "the probe did not run here: the cluster is unreachable, its ClusterProperties are missing, or it cannot pull " + o.Image})
		}
	}
	all := rep.Clusters
	// Twice at most: a miss the first time may be a change still spreading.
	for round := range 2 {
		var mu sync.Mutex
		var failures []Failure
		checks := 0
		var wg sync.WaitGroup
		for _, m := range ms {
			if m.Error != "" {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				items := Checks(o.Zone, o.Namespace, m.Cluster, all)
				results, err := check(ctx, m, o.Namespace, items)
				f := Diagnose(m.Cluster, items, results)
				if err != nil {
					f = []Failure{{From: m.ID, What: "running the checks", Got: err.Error(), Cause: "kubectl exec into the probe failed: the apiserver cannot reach the node's kubelet"}}
				}
				mu.Lock()
				defer mu.Unlock()
				checks += len(items)
				failures = append(failures, f...)
			}()
		}
		wg.Wait()
		rep.Checks = checks
		rep.Failures = append(slices.Clone(notRun), failures...)
		if len(failures) == 0 || round == 1 || ctx.Err() != nil {
			break
		}
		for _, f := range failures {
			o.Log("failed: %s -> %s: %s: %s", f.From, f.To, f.What, f.Got)
		}
		o.Log("%d checks failed; once more in 3 s, in case a change was still spreading", len(failures))
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
		}
	}
	slices.SortStableFunc(rep.Failures, func(a, b Failure) int {
		return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	return rep, ctx.Err()
}

func idsOf(ms []*member) []string {
	var ids []string
	for _, m := range ms {
		if m.Error == "" {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

var probeLabels = map[string]string{"app.kubernetes.io/name": "clustermap-verify"}

// deploy makes the namespace, the probe pod, its two Services and their
// ServiceExports.
func deploy(ctx context.Context, m *member, o Options) error {
	ns := o.Namespace
	// Its own namespace, never one that exists: it is deleted at the end.
	if err := m.cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: probeLabels}}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s exists: verify makes its own and deletes it, pick a --namespace that does not exist", ns)
		}
		return err
	}
	m.made = true
	objs := []client.Object{
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Probe, Labels: probeLabels},
			Spec: corev1.PodSpec{
				Hostname: Probe, Subdomain: Headless,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				AutomountServiceAccountToken:  ptr.To(false),
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{
					Name: Probe, Image: o.Image, Command: []string{"/clustermap"},
					Args: []string{"probe", "serve", "--cluster", m.ID, "--pod", "$(POD_NAME)", "--port", fmt.Sprint(Port)},
					Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
						FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					Ports: []corev1.ContainerPort{{Name: "tcp", ContainerPort: Port}, {Name: "udp", ContainerPort: Port, Protocol: corev1.ProtocolUDP}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(Port)}},
						PeriodSeconds: 1},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				}},
			},
		},
		service(ns, Probe, false), service(ns, Headless, true),
		&mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Probe}},
		&mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Headless}},
	}
	for _, obj := range objs {
		if err := m.cl.Create(ctx, obj); err != nil {
			return fmt.Errorf("%T %s: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}

func service(ns, name string, headless bool) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: probeLabels},
		Spec: corev1.ServiceSpec{Selector: probeLabels, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack),
			Ports: []corev1.ServicePort{
				{Name: PortName, Protocol: corev1.ProtocolTCP, Port: Port, TargetPort: intstr.FromInt32(Port)},
				{Name: PortName + "-udp", Protocol: corev1.ProtocolUDP, Port: Port, TargetPort: intstr.FromInt32(Port)},
			}}}
	if headless {
		s.Spec.ClusterIP = corev1.ClusterIPNone
	}
	return s
}

// settle waits, within o.Wait, for every probe to be ready and for every
// cluster to import every ready probe with its endpoints, then records
// what each cluster has.
func settle(ctx context.Context, ms []*member, o Options) {
	deadline := time.Now().Add(o.Wait)
	for {
		done := true
		for _, m := range ms {
			if m.Error == "" && len(m.PodIPs) == 0 {
				ips, err := readyIPs(ctx, m, o.Namespace)
				if err != nil && time.Now().After(deadline) {
					m.Error = err.Error()
				}
				m.PodIPs = ips
				done = done && len(ips) > 0
			}
		}
		var want, exporters []string
		for _, m := range ms {
			want = append(want, m.PodIPs...)
			if len(m.PodIPs) > 0 {
				exporters = append(exporters, m.ID)
			}
		}
		for _, m := range ms {
			if m.Error == "" {
				// The slices first: the import's status, which names its
				// clusters, is written after them.
				done = done && imported(ctx, m, o.Namespace, want)
				readImports(ctx, m, o.Namespace)
				done = done && m.Imported && m.HeadlessImported && containsAll(m.ImportClusters, exporters)
			}
		}
		if done || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func readyIPs(ctx context.Context, m *member, ns string) ([]string, error) {
	pod := &corev1.Pod{}
	if err := m.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: Probe}, pod); err != nil {
		return nil, err
	}
	ready := slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
	if !ready {
		why := fmt.Sprintf("not ready after the wait: phase %s", pod.Status.Phase)
		for _, s := range pod.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil {
				why += fmt.Sprintf(", %s: %s", w.Reason, w.Message)
			}
		}
		return nil, errors.New(why)
	}
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips, nil
}

func readImports(ctx context.Context, m *member, ns string) {
	si := &mcsv1beta1.ServiceImport{}
	if err := m.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: Probe}, si); err == nil {
		m.Imported, m.ImportIPs, m.ImportClusters = true, si.Spec.IPs, nil
		for _, c := range si.Status.Clusters {
			m.ImportClusters = append(m.ImportClusters, c.Cluster)
		}
		slices.Sort(m.ImportClusters)
	}
	m.HeadlessImported = m.cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: Headless}, &mcsv1beta1.ServiceImport{}) == nil
}

// imported: the endpoints of both imports in m hold every address of want,
// ready: DNS answers and the clusterset IP route only to ready endpoints,
// and a probe's readiness reaches the other clusters after its address.
func imported(ctx context.Context, m *member, ns string, want []string) bool {
	for _, name := range []string{Probe, Headless} {
		list := &discoveryv1.EndpointSliceList{}
		if err := m.cl.List(ctx, list, client.InNamespace(ns),
			client.MatchingLabels{mcsv1beta1.LabelServiceName: name, discoveryv1.LabelManagedBy: imports.ManagedBy}); err != nil {
			return false
		}
		have := map[string]bool{}
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if !kube.EndpointReady(e.Conditions) {
					continue
				}
				for _, a := range e.Addresses {
					have[a] = true
				}
			}
		}
		for _, ip := range want {
			if !have[ip] {
				return false
			}
		}
	}
	return true
}

// check runs the plan's checks in m's probe (`clustermap probe check`
// through the exec API, the plan on stdin) and returns the results.
func check(ctx context.Context, m *member, ns string, items []Item) ([]probe.Result, error) {
	var checks []probe.Check
	for _, it := range items {
		checks = append(checks, it.Check)
	}
	in, err := json.Marshal(checks)
	if err != nil {
		return nil, err
	}
	req := m.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(Probe).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: Probe, Command: []string{"/clustermap", "probe", "check"},
			Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(m.cfg, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(m.cfg, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, err
	}
	var out, errb bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: bytes.NewReader(in), Stdout: &out, Stderr: &errb}); err != nil {
		return nil, fmt.Errorf("%w: %s", err, errb.String())
	}
	var results []probe.Result
	if err := json.Unmarshal(out.Bytes(), &results); err != nil {
		return nil, fmt.Errorf("the probe's answer: %w (%q)", err, out.String())
	}
	return results, nil
}

// cleanup deletes the namespace in every cluster and waits (a minute at
// most) for it to go: the ServiceExports' withdrawal from Cloud Map is
// what takes time.
func cleanup(ctx context.Context, ms []*member, o Options) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, m := range ms {
		if !m.made {
			continue
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}
		if err := m.cl.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
			o.Log("%s: deleting namespace %s: %v (delete it with kubectl delete namespace %s)", m.Context, o.Namespace, err, o.Namespace)
		}
	}
	for _, m := range ms {
		if !m.made {
			continue
		}
		for {
			err := m.cl.Get(ctx, client.ObjectKey{Name: o.Namespace}, &corev1.Namespace{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				o.Log("%s: namespace %s is still being deleted", m.Context, o.Namespace)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}
