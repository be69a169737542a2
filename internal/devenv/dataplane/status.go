package dataplane

import (
	"bufio"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ContainerRun is what the node knows of one container's process.
type ContainerRun struct {
	// Running since StartedAt; else waiting to start (again) unless Done.
	Running   bool
	StartedAt time.Time
	Restarts  int32
	// The last exit, when there was one.
	Exited     bool
	ExitCode   int32
	FinishedAt time.Time
	// Done: exited for good (restartPolicy), or could not be planned.
	Done bool
	// Error says why the container could not start at all.
	Error string
	// Listening: every declared TCP port of the container listens.
	Listening bool
}

// Restarts says whether a container that exited with code starts again
// under the pod's restartPolicy.
func Restarts(policy corev1.RestartPolicy, code int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// PodStatus is the status a pod's containers give it: its phase, the
// containers' states, and Ready once every container runs and listens
// on its declared TCP ports. Transition times of unchanged conditions
// are kept from old.
func PodStatus(p *corev1.Pod, runs map[string]ContainerRun, now time.Time) corev1.PodStatus {
	st := corev1.PodStatus{StartTime: p.Status.StartTime}
	if st.StartTime == nil {
		st.StartTime = &metav1.Time{Time: now}
	}
	ready, running, failed, done := true, false, false, 0
	for _, c := range p.Spec.Containers {
		r := runs[c.Name]
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, RestartCount: r.Restarts,
			Ready: r.Running && r.Listening, Started: &r.Running}
		if r.Exited {
			term := &corev1.ContainerStateTerminated{ExitCode: r.ExitCode, Reason: exitReason(r.ExitCode),
				StartedAt: metav1.Time{Time: r.StartedAt}, FinishedAt: metav1.Time{Time: r.FinishedAt}}
			if r.Done {
				cs.State.Terminated = term
			} else {
				cs.LastTerminationState.Terminated = term
			}
		}
		switch {
		case r.Running:
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Time{Time: r.StartedAt}}}
		case r.Error != "":
			cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: r.Error}}
		case !r.Done && r.Exited:
			cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
		case !r.Done:
			cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
		}
		ready = ready && cs.Ready
		running = running || r.Running || (r.Exited && !r.Done)
		if r.Done && r.Exited {
			done++
			failed = failed || r.ExitCode != 0
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	switch {
	case len(p.Spec.Containers) > 0 && done == len(p.Spec.Containers) && failed:
		st.Phase = corev1.PodFailed
	case len(p.Spec.Containers) > 0 && done == len(p.Spec.Containers):
		st.Phase = corev1.PodSucceeded
	case running:
		st.Phase = corev1.PodRunning
	default:
		st.Phase = corev1.PodPending
	}
	ready = ready && st.Phase == corev1.PodRunning
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Time{Time: now}}
		if ok {
			c.Status = corev1.ConditionTrue
		}
		for _, old := range p.Status.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, true),
		cond(corev1.PodInitialized, true),
		cond(corev1.ContainersReady, ready),
		cond(corev1.PodReady, ready),
	}
	return st
}

func exitReason(code int32) string {
	if code == 0 {
		return "Completed"
	}
	return "Error"
}

// ListeningPorts reads the TCP ports in LISTEN state from the text of
// /proc/<pid>/net/tcp or tcp6: the sockets of that process's network
// namespace.
func ListeningPorts(procNetTCP string) map[int]bool {
	out := map[int]bool{}
	sc := bufio.NewScanner(strings.NewReader(procNetTCP))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st ...; st 0A is LISTEN.
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
			out[int(port)] = true
		}
	}
	return out
}

// SameStatus tells whether a pod's status already says what want says:
// its phase, start time, the conditions want sets and its containers'
// states.
func SameStatus(have, want corev1.PodStatus) bool {
	if have.Phase != want.Phase || have.StartTime == nil || len(have.ContainerStatuses) != len(want.ContainerStatuses) {
		return false
	}
	for _, c := range want.Conditions {
		if !slices.ContainsFunc(have.Conditions, func(h corev1.PodCondition) bool { return h.Type == c.Type && h.Status == c.Status }) {
			return false
		}
	}
	for i, w := range want.ContainerStatuses {
		if summary(have.ContainerStatuses[i]) != summary(w) {
			return false
		}
	}
	return true
}

// summary is what of a container's status the node sets.
func summary(c corev1.ContainerStatus) string {
	s := fmt.Sprintf("%s ready=%t restarts=%d started=%t", c.Name, c.Ready, c.RestartCount, c.Started != nil && *c.Started)
	for _, st := range []corev1.ContainerState{c.State, c.LastTerminationState} {
		switch {
		case st.Running != nil:
			s += " running@" + st.Running.StartedAt.UTC().Format(time.RFC3339)
		case st.Terminated != nil:
			s += fmt.Sprintf(" exited=%d@%s", st.Terminated.ExitCode, st.Terminated.FinishedAt.UTC().Format(time.RFC3339))
		case st.Waiting != nil:
			s += " waiting=" + st.Waiting.Reason + ":" + st.Waiting.Message
		default:
			s += " -"
		}
	}
	return s
}

// TailLines is the last n lines of data.
func TailLines(data []byte, n int) []byte {
	s := strings.TrimSuffix(string(data), "\n")
	if s == "" || n == 0 {
		return nil
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return []byte(strings.Join(lines, "\n") + "\n")
}
