package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// hostPath is the PATH a container's process and an exec session get:
// images are not pulled, so pods run the host's programs.
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Process is what runs for one container of a pod: its command line,
// environment and working directory. Server marks a container without a
// command, which gets the pod server.
type Process struct {
	Container string
	Argv      []string
	Env       []string
	Dir       string
	Server    bool
	// TCP are the ports that must listen before the container is ready.
	TCP []int32
	// Programs stand host programs for paths of the container's image,
	// for its command and its exec sessions alike.
	Programs map[string]string
}

// Bins are the host programs that run for containers: Self (clustermap-dev)
// serves the pods of images the data plane does not know, Clustermap runs
// for clustermap's own image.
type Bins struct{ Self, Clustermap string }

// ClustermapImage is clustermap's image repository and Entrypoint the
// program its containers run: the data plane runs the host's clustermap
// binary for it (the pods of `clustermap verify`, the chart's hooks).
const (
	ClustermapImage      = "ghcr.io/clustermap/clustermap"
	ClustermapEntrypoint = "/clustermap"
)

// ProgramsOf maps the programs of a container's image to host programs.
func ProgramsOf(image string, bins Bins) map[string]string {
	if Repository(image) == ClustermapImage && bins.Clustermap != "" {
		return map[string]string{ClustermapEntrypoint: bins.Clustermap}
	}
	return nil
}

// Repository is an image reference without its tag or digest.
func Repository(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// Rewrite replaces a command's program by the host program standing for it.
func Rewrite(argv []string, programs map[string]string) []string {
	if len(argv) > 0 {
		if host, ok := programs[argv[0]]; ok {
			return append([]string{host}, argv[1:]...)
		}
	}
	return argv
}

// ProcessOf plans a container's process as a kubelet would start it:
// command and args with $(VAR) references expanded, env values and
// fieldRefs resolved in order, the working directory. A container with
// no command runs its image's entrypoint where the data plane knows the
// image, else the pod server (bins.Self) answering on the pod's ports. An
// env source the dev data plane cannot read is an error naming it. home
// is the container's HOME unless its env sets one.
func ProcessOf(p *corev1.Pod, c *corev1.Container, bins Bins, cluster, home string) (Process, error) {
	env, err := EnvOf(p, c, home)
	if err != nil {
		return Process{}, err
	}
	out := Process{Container: c.Name, Env: env, Dir: c.WorkingDir, Programs: ProgramsOf(c.Image, bins)}
	if out.Dir == "" {
		out.Dir = "/"
	}
	command := c.Command
	if len(command) == 0 && out.Programs != nil {
		command = []string{ClustermapEntrypoint}
	}
	if len(command) == 0 {
		tcp, udp := ServerPorts(p, c)
		out.Server, out.TCP = true, tcp
		out.Argv = []string{bins.Self, "podserver", "--pod", p.Name, "--namespace", p.Namespace, "--cluster", cluster,
			"--tcp", joinPorts(tcp), "--udp", joinPorts(udp)}
		return out, nil
	}
	out.TCP, _ = Ports(c)
	vars := envMap(env)
	for _, a := range append(append([]string{}, command...), c.Args...) {
		out.Argv = append(out.Argv, Expand(a, vars))
	}
	out.Argv = Rewrite(out.Argv, out.Programs)
	return out, nil
}

// EnvOf is a container's environment: the host's PATH, HOSTNAME, HOME
// (home: a directory of the pod's own, since its processes share the
// host's filesystem and a kubectl in it writes its cache there), then the
// container's env entries in order, each able to refer to the ones before.
func EnvOf(p *corev1.Pod, c *corev1.Container, home string) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("container %s: envFrom is not read by the dev data plane: list the variables under env", c.Name)
	}
	env := []string{"PATH=" + hostPath, "HOSTNAME=" + p.Name, "HOME=" + home}
	vars := envMap(env)
	for _, e := range c.Env {
		v := Expand(e.Value, vars)
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return nil, fmt.Errorf("container %s: env %s: only value and fieldRef are read by the dev data plane", c.Name, e.Name)
			}
			var err error
			if v, err = FieldValue(p, e.ValueFrom.FieldRef.FieldPath); err != nil {
				return nil, fmt.Errorf("container %s: env %s: %w", c.Name, e.Name, err)
			}
		}
		env = append(env, e.Name+"="+v)
		vars[e.Name] = v
	}
	return env, nil
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// FieldValue reads a fieldRef of the downward API.
func FieldValue(p *corev1.Pod, path string) (string, error) {
	ips := func(list []corev1.PodIP) string {
		s := make([]string, len(list))
		for i, ip := range list {
			s[i] = ip.IP
		}
		return strings.Join(s, ",")
	}
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "metadata.uid":
		return string(p.UID), nil
	case "spec.nodeName":
		return p.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return p.Spec.ServiceAccountName, nil
	case "status.podIP":
		return p.Status.PodIP, nil
	case "status.podIPs":
		return ips(p.Status.PodIPs), nil
	case "status.hostIP":
		return p.Status.HostIP, nil
	case "status.hostIPs":
		var list []corev1.PodIP
		for _, ip := range p.Status.HostIPs {
			list = append(list, corev1.PodIP(ip))
		}
		return ips(list), nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": p.Labels, "metadata.annotations": p.Annotations} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok && strings.HasSuffix(key, "']") {
			return m[strings.TrimSuffix(key, "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not one the dev data plane knows", path)
}

// Expand replaces $(VAR) references to known variables, as a kubelet does
// in command, args and env values: $$ is a literal $, and a reference to
// an unknown variable stays as written.
func Expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
				name := s[i+2 : i+2+end]
				if v, ok := vars[name]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(s[i : i+3+end])
				}
				i += 2 + end
				continue
			}
		}
		b.WriteByte('$')
	}
	return b.String()
}

// Wanted tells whether a pod should have a data plane, and with which
// addresses: every pod with addresses when all, else those annotated.
func Wanted(p *corev1.Pod, all bool) ([]netip.Addr, bool) {
	if p == nil || p.DeletionTimestamp != nil || p.Spec.HostNetwork || (!all && p.Annotations[Annotation] != "true") {
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

// Ports are a container's declared ports by protocol.
func Ports(c *corev1.Container) (tcp, udp []int32) {
	for _, port := range c.Ports {
		switch port.Protocol {
		case corev1.ProtocolUDP:
			udp = append(udp, port.ContainerPort)
		case corev1.ProtocolSCTP:
		default:
			tcp = append(tcp, port.ContainerPort)
		}
	}
	return tcp, udp
}

// ServerPorts are the ports a container's pod server answers on: its own,
// or 80/TCP when no container of the pod declares any, for the first
// container with no command only: the pod's containers share its network,
// and a second server on 80 would fail, leaving the pod never Ready (the
// upstream conformance suite's pods are two such containers).
func ServerPorts(p *corev1.Pod, c *corev1.Container) (tcp, udp []int32) {
	tcp, udp = Ports(c)
	if len(tcp)+len(udp) > 0 || slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return len(c.Ports) > 0 }) {
		return tcp, udp
	}
	if i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return len(c.Command) == 0 }); i >= 0 && p.Spec.Containers[i].Name == c.Name {
		tcp = []int32{80}
	}
	return tcp, udp
}

func joinPorts(ports []int32) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}
