//go:build linux

package devenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/clustermap/clustermap/internal/devenv/dataplane"
)

const fabricFile = "fabric.json"

// startFabric builds the environment's fabric and node namespaces and
// records them in fabric.json, for the node agents and `dev exec`. Down
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

// PodNetNS finds the network namespace of a data plane pod ("namespace/name")
// of a cluster of the environment in stateDir.
func PodNetNS(stateDir, cluster, pod string) (string, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return "", err
	}
	f, err := dataplane.Load(filepath.Join(abs, fabricFile))
	if os.IsNotExist(err) {
		return "", fmt.Errorf("no environment with a data plane runs from %s: start one with `clustermap-dev up --dataplane` (or pass its --state-dir)", stateDir)
	}
	if err != nil {
		return "", err
	}
	if f.NodeIndex(cluster) == 0 {
		var ids []string
		for _, n := range f.Nodes {
			ids = append(ids, n.Cluster)
		}
		return "", fmt.Errorf("no cluster %q in the environment: it has %s", cluster, strings.Join(ids, ", "))
	}
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" {
		return "", fmt.Errorf("name the pod as NAMESPACE/NAME, got %q", pod)
	}
	netns := f.PodOf(cluster, ns, name, nil).NetNS
	if !dataplane.Exists(netns) {
		return "", fmt.Errorf("pod %s of %s has no data plane: it must exist, be Running, and carry the annotation %s: \"true\" (on its template)", pod, cluster, dataplane.Annotation)
	}
	return netns, nil
}

// PodExec runs a command in a data plane pod ("namespace/name") of cluster
// c, as `clustermap-dev exec` does, and returns its output.
func (e *Env) PodExec(ctx context.Context, c *Cluster, pod string, argv ...string) ([]byte, error) {
	args := append([]string{"exec", "--state-dir", e.StateDir, c.ID, pod, "--"}, argv...)
	return exec.CommandContext(ctx, filepath.Join(e.BinDir, DevBinary), args...).CombinedOutput()
}
