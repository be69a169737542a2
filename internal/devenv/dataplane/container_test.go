package dataplane

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func listener() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "u1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "cluster-1-node-2", Containers: []corev1.Container{{
			Name: "socat", Image: "alpine/socat", WorkingDir: "/tmp",
			Command: []string{"sh", "-c"},
			Args:    []string{"socat TCP-LISTEN:42,fork SYSTEM:'echo pod ip $MY_POD_IP' # $(GREETING) $$(GREETING) $(MISSING)"},
			Env: []corev1.EnvVar{
				{Name: "WHO", Value: "web"},
				{Name: "GREETING", Value: "hello $(WHO)"},
				{Name: "MY_POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
				{Name: "MY_NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "MY_APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			},
			Ports: []corev1.ContainerPort{{ContainerPort: 42}, {ContainerPort: 42, Protocol: corev1.ProtocolUDP}},
		}}},
		Status: corev1.PodStatus{PodIP: "10.101.4.2", PodIPs: []corev1.PodIP{{IP: "10.101.4.2"}, {IP: "fd00:10:101:1::2"}}},
	}
}

func TestProcessOfACommand(t *testing.T) {
	p := listener()
	proc, err := ProcessOf(p, &p.Spec.Containers[0], Bins{Self: "/bin/clustermap-dev"}, "cluster-1", "/pods/web-0/home")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sh", "-c", "socat TCP-LISTEN:42,fork SYSTEM:'echo pod ip $MY_POD_IP' # hello web $(GREETING) $(MISSING)"}
	if !slices.Equal(proc.Argv, want) {
		t.Errorf("argv %q, want %q", proc.Argv, want)
	}
	for _, kv := range []string{"PATH=" + hostPath, "HOSTNAME=web-0", "HOME=/pods/web-0/home", "GREETING=hello web", "MY_POD_IP=10.101.4.2,fd00:10:101:1::2",
		"MY_NODE=cluster-1-node-2", "MY_APP=web"} {
		if !slices.Contains(proc.Env, kv) {
			t.Errorf("env lacks %s: %q", kv, proc.Env)
		}
	}
	if proc.Dir != "/tmp" || proc.Server || !slices.Equal(proc.TCP, []int32{42}) {
		t.Errorf("dir %s server %t tcp %v", proc.Dir, proc.Server, proc.TCP)
	}
}

func TestProcessOfNoCommandIsThePodServer(t *testing.T) {
	p := listener()
	c := &p.Spec.Containers[0]
	c.Command, c.Args, c.WorkingDir = nil, nil, ""
	proc, err := ProcessOf(p, c, Bins{Self: "/bin/clustermap-dev"}, "cluster-1", "/pods/web-0/home")
	if err != nil {
		t.Fatal(err)
	}
	if !proc.Server || proc.Dir != "/" || !slices.Equal(proc.Argv, []string{"/bin/clustermap-dev", "podserver", "--pod", "web-0",
		"--namespace", "shop", "--cluster", "cluster-1", "--tcp", "42", "--udp", "42"}) {
		t.Errorf("%+v", proc)
	}
	// No port declared anywhere: the server answers HTTP on 80.
	c.Ports = nil
	if proc, _ := ProcessOf(p, c, Bins{Self: "/x"}, "cluster-1", "/pods/web-0/home"); !slices.Equal(proc.TCP, []int32{80}) {
		t.Errorf("tcp %v, want 80", proc.TCP)
	}
	// A second such container shares the pod's network: its server answers
	// on no port, or it would fail to bind 80.
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "second"})
	if proc, _ := ProcessOf(p, &p.Spec.Containers[1], Bins{Self: "/x"}, "cluster-1", "/pods/web-0/home"); !proc.Server || len(proc.TCP) != 0 {
		t.Errorf("second container: server %t, tcp %v, want a server on no port", proc.Server, proc.TCP)
	}
	if proc, _ := ProcessOf(p, &p.Spec.Containers[0], Bins{Self: "/x"}, "cluster-1", "/pods/web-0/home"); !slices.Equal(proc.TCP, []int32{80}) {
		t.Errorf("first container: tcp %v, want 80", proc.TCP)
	}
}

func TestProcessOfUnreadableEnvSaysWhich(t *testing.T) {
	p := listener()
	c := &p.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "t"}}})
	if _, err := ProcessOf(p, c, Bins{Self: "/x"}, "c", "/pods/web-0/home"); err == nil || !strings.Contains(err.Error(), "env TOKEN") {
		t.Errorf("err %v, want one naming env TOKEN", err)
	}
	c.Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.bogus"}}}}
	if _, err := ProcessOf(p, c, Bins{Self: "/x"}, "c", "/pods/web-0/home"); err == nil || !strings.Contains(err.Error(), "spec.bogus") {
		t.Errorf("err %v, want one naming the fieldRef", err)
	}
}

func TestWantedAnnotatedOrAll(t *testing.T) {
	p := listener()
	if _, ok := Wanted(p, false); ok {
		t.Error("an unannotated pod wanted without all")
	}
	if ips, ok := Wanted(p, true); !ok || len(ips) != 2 {
		t.Errorf("all: %v %t", ips, ok)
	}
	p.Spec.HostNetwork = true
	if _, ok := Wanted(p, true); ok {
		t.Error("a host-network pod wanted")
	}
}

func TestPodStatusFollowsTheProcesses(t *testing.T) {
	p := listener()
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	ready := func(st corev1.PodStatus) bool {
		for _, c := range st.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	st := PodStatus(p, nil, now)
	if st.Phase != corev1.PodPending || ready(st) || st.ContainerStatuses[0].State.Waiting == nil {
		t.Errorf("before start: %+v", st)
	}
	// Running but not listening yet: not Ready.
	st = PodStatus(p, map[string]ContainerRun{"socat": {Running: true, StartedAt: now}}, now)
	if st.Phase != corev1.PodRunning || ready(st) {
		t.Errorf("running, not listening: phase %s ready %t", st.Phase, ready(st))
	}
	st = PodStatus(p, map[string]ContainerRun{"socat": {Running: true, StartedAt: now, Listening: true}}, now)
	if !ready(st) || !st.ContainerStatuses[0].Ready {
		t.Errorf("listening: not ready: %+v", st)
	}
	// Unchanged conditions keep their transition time.
	p.Status = st
	later := PodStatus(p, map[string]ContainerRun{"socat": {Running: true, StartedAt: now, Listening: true}}, now.Add(time.Minute))
	if !SameStatus(p.Status, later) || !later.Conditions[3].LastTransitionTime.Equal(&st.Conditions[3].LastTransitionTime) {
		t.Errorf("an unchanged status differs: %+v", later)
	}
	// Exited, to be restarted: CrashLoopBackOff with the last exit kept.
	st = PodStatus(p, map[string]ContainerRun{"socat": {Exited: true, ExitCode: 2, StartedAt: now, FinishedAt: now, Restarts: 1}}, now)
	cs := st.ContainerStatuses[0]
	if st.Phase != corev1.PodRunning || ready(st) || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" ||
		cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 2 || cs.RestartCount != 1 {
		t.Errorf("crash looping: %+v", st)
	}
	if SameStatus(p.Status, st) {
		t.Error("a changed status is the same")
	}
	// Done for good: the phase says how it ended.
	for code, phase := range map[int32]corev1.PodPhase{0: corev1.PodSucceeded, 1: corev1.PodFailed} {
		st = PodStatus(p, map[string]ContainerRun{"socat": {Exited: true, Done: true, ExitCode: code}}, now)
		if st.Phase != phase || st.ContainerStatuses[0].State.Terminated == nil {
			t.Errorf("exit %d: %+v", code, st)
		}
	}
}

func TestRestartPolicies(t *testing.T) {
	for _, c := range []struct {
		policy corev1.RestartPolicy
		code   int
		want   bool
	}{{corev1.RestartPolicyAlways, 0, true}, {"", 0, true}, {corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 1, true}, {corev1.RestartPolicyNever, 1, false}} {
		if got := Restarts(c.policy, c.code); got != c.want {
			t.Errorf("%s exit %d: restarts %t", c.policy, c.code, got)
		}
	}
}

func TestListeningPorts(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:002A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
`
	got := ListeningPorts(tcp)
	if !got[42] || got[8080] || len(got) != 1 {
		t.Errorf("listening %v, want 42 only (8080 is an established connection)", got)
	}
}

func TestTailLines(t *testing.T) {
	if got := string(TailLines([]byte("a\nb\nc\n"), 2)); got != "b\nc\n" {
		t.Errorf("%q", got)
	}
	if got := TailLines([]byte("a\n"), 0); len(got) != 0 {
		t.Errorf("%q", got)
	}
}

// clustermap's image runs the host's clustermap, by its entrypoint or its
// args alone, in the container and in exec sessions; other images do not.
func TestProcessOfClustermapImage(t *testing.T) {
	bins := Bins{Self: "/bin/clustermap-dev", Clustermap: "/work/bin/clustermap"}
	for _, c := range []struct {
		image         string
		command, args []string
		want          []string
	}{
		{"ghcr.io/clustermap/clustermap:v1.2.3", []string{"/clustermap"}, []string{"probe", "serve"}, []string{"/work/bin/clustermap", "probe", "serve"}},
		{"ghcr.io/clustermap/clustermap@sha256:abc", nil, []string{"status"}, []string{"/work/bin/clustermap", "status"}},
		{"ghcr.io/clustermap/clustermap", []string{"sh", "-c", "/clustermap"}, nil, []string{"sh", "-c", "/clustermap"}},
		{"registry:5000/other/clustermap:v1", []string{"/clustermap"}, nil, []string{"/clustermap"}},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: c.image, Command: c.command, Args: c.args}}}}
		proc, err := ProcessOf(p, &p.Spec.Containers[0], bins, "cluster-1", "/pods/web-0/home")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(proc.Argv, c.want) || proc.Server {
			t.Errorf("%s %v %v: argv %v (server %v), want %v", c.image, c.command, c.args, proc.Argv, proc.Server, c.want)
		}
		if got := Rewrite([]string{"/clustermap", "probe", "check"}, proc.Programs); (got[0] == bins.Clustermap) != strings.HasPrefix(c.image, ClustermapImage) {
			t.Errorf("%s: exec of /clustermap runs %v", c.image, got)
		}
	}
}
