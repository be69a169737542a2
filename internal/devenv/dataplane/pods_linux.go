package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/clustermap/clustermap/internal/devenv/supervise"
)

// podRun is a pod's network namespace and its containers' processes.
type podRun struct {
	uid    types.UID
	ips    []netip.Addr
	ns     string
	creds  string // the service account's files, "" without
	logDir string
	procs  []*supervise.Process

	mu      sync.Mutex
	runs    map[string]ContainerRun
	pids    map[string]int
	targets map[string]Target
	tcp     map[string][]int32
	first   string // the container exec and logs default to
}

// readyPoll is how often a running pod's declared ports are looked at
// until they listen; readyRecheck how often after, as a readiness probe
// with periodSeconds 1 would: a port that stops listening turns the pod
// unready, and its endpoints with it.
const (
	readyPoll    = 200 * time.Millisecond
	readyRecheck = time.Second
)

func (a *agent) sync(ctx context.Context, k string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(k)
	p, err := a.lister.Pods(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if apierrors.IsNotFound(err) {
		p = nil
	}
	ips, want := Wanted(p, a.o.AllPods)
	if run := a.run(k); run != nil && (!want || run.uid != p.UID || !slices.Equal(run.ips, ips)) {
		if err := a.stop(ctx, k); err != nil {
			return err
		}
	}
	if !want {
		return nil
	}
	run := a.run(k)
	if run == nil {
		if run, err = a.start(ctx, k, p, ips); err != nil {
			return err
		}
	}
	return a.report(ctx, k, p, run)
}

func (a *agent) run(k string) *podRun {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pods[k]
}

func (a *agent) start(ctx context.Context, k string, p *corev1.Pod, ips []netip.Addr) (*podRun, error) {
	pod := a.o.Fabric.PodOf(a.o.Cluster, p.Namespace, p.Name, ips)
	// A namespace of the same name is a former pod's.
	if err := DeleteNS(ctx, pod.NetNS); err != nil {
		return nil, err
	}
	if err := Run(ctx, pod.Steps(a.node)); err != nil {
		_ = DeleteNS(ctx, pod.NetNS)
		return nil, err
	}
	if err := WriteResolvConf(pod.NetNS, a.o.Fabric.ResolvConf(a.nodeIdx, ips, p.Namespace)); err != nil {
		return nil, err
	}
	run := &podRun{uid: p.UID, ips: ips, ns: pod.NetNS, runs: map[string]ContainerRun{}, pids: map[string]int{},
		targets: map[string]Target{}, tcp: map[string][]int32{},
		logDir: filepath.Join(a.o.LogDir, "pods", p.Namespace+"_"+p.Name+"_"+string(p.UID))}
	if err := os.MkdirAll(run.logDir, 0o755); err != nil {
		return nil, err
	}
	creds, err := a.credentials(ctx, p, filepath.Join(run.logDir, "serviceaccount"))
	if err != nil {
		// As a kubelet: the pod does not start without its volume.
		_ = DeleteNS(ctx, pod.NetNS)
		return nil, err
	}
	run.creds = creds
	apiEnv := a.api.env(a.o.Fabric, ips)
	grace := 5 * time.Second
	if g := p.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		if run.first == "" {
			run.first = c.Name
		}
		log := filepath.Join(run.logDir, c.Name+".log")
		home := filepath.Join(run.logDir, "home", c.Name)
		if err := os.MkdirAll(home, 0o755); err != nil {
			return nil, err
		}
		proc, err := ProcessOf(p, c, Bins{Self: a.o.Self, Clustermap: a.o.Clustermap}, a.o.Cluster, home)
		if err != nil {
			// The pod shows why; nothing runs for the container.
			klog.ErrorS(err, "a container cannot run in the dev data plane", "pod", k)
			run.runs[c.Name] = ContainerRun{Done: true, Error: err.Error()}
			continue
		}
		proc.Env = append(slices.Clone(apiEnv), proc.Env...)
		run.targets[c.Name] = Target{NetNS: pod.NetNS, Env: proc.Env, Dir: proc.Dir, Log: log, Programs: proc.Programs,
			Self: a.o.Self, Credentials: creds}
		run.tcp[c.Name] = proc.TCP
		run.procs = append(run.procs, a.process(k, run, proc, log, grace, p.Spec.RestartPolicy))
	}
	a.mu.Lock()
	a.pods[k] = run
	a.mu.Unlock()
	for _, proc := range run.procs {
		proc.Start()
	}
	klog.InfoS("pod data plane up", "pod", k, "netns", pod.NetNS, "ips", ips, "containers", len(run.procs))
	return run, nil
}

// process supervises one container: each start and exit is recorded
// and queues the pod, whose status then says so.
func (a *agent) process(k string, run *podRun, proc Process, log string, grace time.Duration, policy corev1.RestartPolicy) *supervise.Process {
	name := proc.Container
	return &supervise.Process{Name: "pod " + k + " container " + name, Argv: inPod(run.ns, a.o.Self, run.creds, proc.Argv),
		Env: proc.Env, OwnEnv: true, Dir: proc.Dir, Log: log, Grace: grace,
		OnStart: func(pid int) {
			run.mu.Lock()
			r := run.runs[name]
			if r.Exited {
				r.Restarts++
			}
			r.Running, r.StartedAt, r.Listening, r.Error = true, time.Now(), len(run.tcp[name]) == 0, ""
			run.runs[name], run.pids[name] = r, pid
			run.mu.Unlock()
			a.queue.Add(k)
		},
		OnExit: func(err error) {
			code := exitCode(err)
			run.mu.Lock()
			r := run.runs[name]
			if !r.Running {
				// It never started: the command line could not be run.
				r.Error = fmt.Sprintf("starting %s: %v", strings.Join(proc.Argv, " "), err)
			}
			r.Running, r.Exited, r.ExitCode, r.FinishedAt = false, true, int32(code), time.Now()
			r.Done = !Restarts(policy, code)
			run.runs[name] = r
			delete(run.pids, name)
			run.mu.Unlock()
			a.queue.Add(k)
		},
		Again: func(err error) bool { return Restarts(policy, exitCode(err)) },
	}
}

// exitCode is a process's exit status as a container runtime reports
// it: 128+n for a signal, 128 when it could not start.
func exitCode(err error) int {
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exitErr.ExitCode()
	}
	return 128
}

// report writes the pod's status when its containers' states changed, and
// looks again shortly while a running container's ports do not listen,
// every readyRecheck while they do.
func (a *agent) report(ctx context.Context, k string, p *corev1.Pod, run *podRun) error {
	run.mu.Lock()
	waiting, probed := false, false
	for name, r := range run.runs {
		if r.Running && len(run.tcp[name]) > 0 {
			r.Listening = listens(run.pids[name], run.tcp[name])
			run.runs[name] = r
			waiting, probed = waiting || !r.Listening, true
		}
	}
	runs := make(map[string]ContainerRun, len(run.runs))
	for name, r := range run.runs {
		runs[name] = r
	}
	run.mu.Unlock()
	switch {
	case waiting:
		a.queue.AddAfter(k, readyPoll)
	case probed:
		a.queue.AddAfter(k, readyRecheck)
	}
	want := PodStatus(p, runs, time.Now())
	if SameStatus(p.Status, want) {
		return nil
	}
	// The uid precondition keeps a write for a deleted pod off a new one
	// of the same name.
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": p.UID}, "status": map[string]any{
		"phase": want.Phase, "conditions": want.Conditions, "containerStatuses": want.ContainerStatuses, "startTime": want.StartTime}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = a.cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone or replaced: the informer brings the news
	}
	return err
}

// listens tells whether every port listens in the network namespace of
// process pid.
func listens(pid int, ports []int32) bool {
	if len(ports) == 0 {
		return true
	}
	if pid == 0 {
		return false
	}
	open := map[int]bool{}
	for _, f := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for port := range ListeningPorts(string(data)) {
			open[port] = true
		}
	}
	for _, port := range ports {
		if !open[int(port)] {
			return false
		}
	}
	return true
}

// find names where a container's commands run, for the kubelet API.
func (a *agent) find(namespace, pod, container string) (Target, error) {
	run := a.run(namespace + "/" + pod)
	if run == nil {
		return Target{}, fmt.Errorf("pod %s/%s has no data plane on this node: it runs commands once it has addresses, is not being deleted, and (unless the cluster runs every pod) carries the annotation %s: \"true\"", namespace, pod, Annotation)
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	if container == "" {
		container = run.first
	}
	t, ok := run.targets[container]
	if !ok {
		if r, bad := run.runs[container]; bad && r.Error != "" {
			return Target{}, fmt.Errorf("container %s of pod %s/%s cannot run: %s", container, namespace, pod, r.Error)
		}
		return Target{}, fmt.Errorf("pod %s/%s has no container %s", namespace, pod, container)
	}
	return t, nil
}

func (a *agent) stop(ctx context.Context, k string) error {
	run := a.run(k)
	for _, proc := range run.procs {
		proc.Stop()
	}
	// Exec sessions and whatever the containers left go with the namespace.
	if err := DeleteNS(ctx, run.ns); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.pods, k)
	a.mu.Unlock()
	if err := os.RemoveAll(run.logDir); err != nil {
		klog.ErrorS(err, "removing a pod's logs", "pod", k)
	}
	klog.InfoS("pod data plane down", "pod", k, "netns", run.ns)
	return nil
}

func (a *agent) stopAll() {
	a.mu.Lock()
	keys := slices.Collect(maps.Keys(a.pods))
	a.mu.Unlock()
	for _, k := range keys {
		if err := a.stop(context.Background(), k); err != nil {
			klog.ErrorS(err, "removing a pod data plane", "pod", k)
		}
	}
}
