//go:build linux

package devenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/clustermap/clustermap/internal/devenv/dataplane"
)

const fabricFile = "fabric.json"

// startFabric builds the environment's fabric and node namespaces and
// records them in fabric.json, for the node agents. Down
// removes it all, also when this fails half-way.
func startFabric(ctx context.Context, opts Options, specs []ClusterSpec) error {
	f := &dataplane.Fabric{Tag: dataplane.TagOf(opts.StateDir)}
	for _, s := range specs {
		f.Nodes = append(f.Nodes, dataplane.Node{Cluster: s.ID, PodCIDRs: s.PodCIDRs})
	}
	if err := f.Build(ctx); err != nil {
		return fmt.Errorf("building the data plane: %w", err)
	}
	fmt.Fprintf(opts.Log, "devenv: data plane %s on 198.18.%d.0/24\n", f.Tag, f.Subnet)
	return f.Save(filepath.Join(opts.StateDir, fabricFile))
}

// nodeComponent fills in the kwokctl component running a cluster's data
// plane node, started and stopped with the cluster. kwokctl keeps a
// component's pid and log under its binary's name, so the node runs
// clustermap-dev through a link of its own name, apart from the IPAM's.
func nodeComponent(opts Options, s ClusterSpec, v *kwokValues) error {
	bin := filepath.Join(opts.StateDir, "bin", "clustermap-node")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join(opts.BinDir, DevBinary), bin); err != nil && !os.IsExist(err) {
		return err
	}
	v.NodeBinary, v.Fabric, v.Cluster = bin, filepath.Join(opts.StateDir, fabricFile), s.ID
	v.KubeProxy, v.Clustermap = filepath.Join(opts.BinDir, "kube-proxy"), filepath.Join(opts.BinDir, ProductBinary)
	v.CoreDNS, v.AllPods = filepath.Join(opts.BinDir, "coredns"), opts.AllPods
	f, err := dataplane.Load(v.Fabric)
	if err != nil {
		return err
	}
	for _, a := range f.HostAddrs() {
		v.CertSANs = append(v.CertSANs, a.String())
	}
	return nil
}

// WriteNodeKubeconfig copies a cluster's kubeconfig for components in its
// node namespace: they reach the apiserver at the host's fabric address,
// checking its certificate against the name it was issued for.
func WriteNodeKubeconfig(src, dst, host string) error {
	kc, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return err
	}
	if err := clientcmdapi.FlattenConfig(kc); err != nil {
		return err
	}
	for _, c := range kc.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			return err
		}
		if c.TLSServerName == "" {
			c.TLSServerName = u.Hostname()
		}
		u.Host = net.JoinHostPort(host, u.Port())
		c.Server = u.String()
	}
	return clientcmd.WriteToFile(*kc, dst)
}

// Protocols of a pod exec: WebSocket (kubectl's first choice, which the
// apiserver translates to SPDY towards the node) or SPDY.
const (
	WebSocket = "websocket"
	SPDY      = "spdy"
)

// PodExec runs a command in a pod's container of cluster c through the
// apiserver's exec API (client-go's remotecommand, as kubectl exec and
// test suites do), with stdin when set. The error of a command that ran
// and failed carries its exit code (k8s.io/client-go/util/exec.ExitError).
func PodExec(ctx context.Context, c *Cluster, protocol, ns, pod, container string, stdin io.Reader, argv ...string) (stdout, stderr string, err error) {
	ex, err := podExecutor(c, protocol, ns, pod, &corev1.PodExecOptions{Container: container, Command: argv, Stdin: stdin != nil, Stdout: true, Stderr: true})
	if err != nil {
		return "", "", err
	}
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), err
}

// PodTerminal runs a command as PodExec does, on a terminal (TTY: true,
// as `kubectl exec -t` and many test suites ask): stdout carries all its
// output, stdin (when set) is what is typed, and sizes (when set) the
// client's window sizes.
func PodTerminal(ctx context.Context, c *Cluster, protocol, ns, pod, container string, stdin io.Reader, stdout io.Writer, sizes remotecommand.TerminalSizeQueue, argv ...string) error {
	ex, err := podExecutor(c, protocol, ns, pod, &corev1.PodExecOptions{Container: container, Command: argv, Stdin: stdin != nil, Stdout: true, TTY: true})
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Tty: true, TerminalSizeQueue: sizes})
}

func podExecutor(c *Cluster, protocol, ns, pod string, o *corev1.PodExecOptions) (remotecommand.Executor, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").VersionedParams(o, scheme.ParameterCodec)
	if protocol == WebSocket {
		return remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	}
	return remotecommand.NewSPDYExecutor(c.Config, "POST", req.URL())
}
