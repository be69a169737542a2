//go:build linux

// Package devenv starts and stops local Kubernetes clusters for the demo,
// tests and benchmarks: real kube-apiservers and etcd run by kwokctl's binary
// runtime from ./bin, with simulated nodes and pods from kwok.
package devenv

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/registry/hub"
)

// Defaults of a development environment.
const (
	DefaultPrefix     = "clustermap"
	DefaultClusterSet = "clusterset-dev"
	DefaultNodes      = 3
	stateFile         = "state.json"
)

// Binaries are the tools kwokctl's binary runtime needs, all from ./bin.
// clustermap-dev itself assigns the pods' addresses (its ipam command);
// clustermap serves DNS in a data plane's nodes.
var Binaries = []string{"kwokctl", "kwok", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", DevBinary, ProductBinary}

// The two binaries of this project the environment runs: the product, and
// the dev environment's own (make build puts both in ./bin).
const (
	ProductBinary = "clustermap"
	DevBinary     = "clustermap-dev"
)

// Options say what environment to start.
type Options struct {
	Clusters int
	// BinDir holds the pinned tools (`make tools`).
	BinDir string
	// StateDir holds every file of the environment; removed by Down.
	StateDir string
	// Kubeconfig is where the merged kubeconfig goes; default StateDir/kubeconfig.
	Kubeconfig string
	Prefix     string
	ClusterSet string
	// Nodes is the number of simulated nodes per cluster.
	Nodes int
	// IPFamily is ipv4, ipv6 or dual (the default): the families of every
	// pod's and Service's addresses.
	IPFamily string
	// PortBase, when set, fixes cluster i's apiserver port at PortBase+i; keep
	// it below kwokctl's own picks, which count down from 32767.
	PortBase int
	// Dataplane gives every cluster a real network (package dataplane):
	// needs root, nft and kube-proxy. The annotated pods get a network
	// namespace and run their containers' commands as host processes in
	// it; with AllPods every pod does.
	Dataplane, AllPods bool
	// Hub starts a hub cluster beside the members, initialised as the
	// clusterset's registry (clustermap hub init), and writes each
	// member's kubeconfig for it (clustermap hub join) under StateDir/hub.
	Hub bool
	Log io.Writer
}

// Env is a running environment.
type Env struct {
	Options
	Clusters []*Cluster
	// HubCluster, with Options.Hub, is the hub; HubKubeconfigs each
	// member's kubeconfig file for it, by cluster id.
	HubCluster     *Cluster
	HubKubeconfigs map[string]string
}

// stopped holds the ports of the clusters StopCluster stopped, by kwok
// directory, with what lets them go. Package-wide: tests copy an Env to
// work on some of its clusters.
var stopped = struct {
	sync.Mutex
	release map[string]func()
}{release: map[string]func(){}}

// Cluster is one running local cluster.
type Cluster struct {
	ClusterSpec
	// Server is the apiserver URL.
	Server string
	// Config reaches the apiserver as cluster admin.
	Config *rest.Config
}

// state is what Down needs to find everything an Up left behind.
type state struct {
	Prefix     string        `json:"prefix"`
	Kubeconfig string        `json:"kubeconfig"`
	BinDir     string        `json:"binDir"`
	Clusters   []ClusterSpec `json:"clusters"`
}

func (o *Options) defaults() error {
	o.Prefix = cmp.Or(o.Prefix, DefaultPrefix)
	o.ClusterSet = cmp.Or(o.ClusterSet, DefaultClusterSet)
	o.Nodes = cmp.Or(o.Nodes, DefaultNodes)
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return fmt.Errorf("--nodes must be between 1 and %d, got %d", MaxNodes, o.Nodes)
	}
	if o.AllPods && !o.Dataplane {
		return errors.New("--all-pods runs pods in the data plane: add --dataplane")
	}
	o.IPFamily = cmp.Or(o.IPFamily, DualStack)
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.StateDir == "" {
		return errors.New("devenv: no state directory")
	}
	var err error
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		return err
	}
	o.Kubeconfig = cmp.Or(o.Kubeconfig, filepath.Join(o.StateDir, "kubeconfig"))
	if o.Kubeconfig, err = filepath.Abs(o.Kubeconfig); err != nil {
		return err
	}
	o.BinDir, err = filepath.Abs(o.BinDir)
	return err
}

// CheckBinaries reports the first missing tool with the command that builds it.
func CheckBinaries(binDir string) error {
	for _, b := range Binaries {
		p := filepath.Join(binDir, b)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing: run `make tools build` in the clustermap checkout (or pass the directory holding it)", p)
		}
	}
	return nil
}

// checkPorts fails on the first fixed apiserver port that something listens on.
func checkPorts(specs []ClusterSpec) error {
	for _, s := range specs {
		if s.APIServerPort == 0 {
			continue
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(s.APIServerPort))
		if err != nil {
			return fmt.Errorf("port %d for %s is in use%s: stop whatever listens there, or choose other ports with --port-base", s.APIServerPort, s.ID, holder(s.APIServerPort))
		}
		l.Close()
	}
	return nil
}

// holder says which process holds a port, as ss sees it (nothing when ss
// cannot tell).
func holder(port int) string {
	out, err := exec.Command("ss", "-Htanp", "sport = :"+strconv.Itoa(port)).Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return ""
	}
	return " (" + strings.Join(strings.Fields(string(out)), " ") + ")"
}

// Up starts the clusters and returns once every one is ready. On failure it
// stops whatever it started: no half-started environment stays behind.
func Up(ctx context.Context, opts Options) (env *Env, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	specs, err := Layout(opts.Prefix, opts.Clusters, opts.PortBase, opts.IPFamily)
	if err != nil {
		return nil, err
	}
	all := specs
	if opts.Hub {
		all = append(slices.Clip(specs), HubSpec(opts.Prefix, opts.PortBase))
	}
	if err := CheckBinaries(opts.BinDir); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(opts.StateDir, stateFile)); err == nil {
		return nil, fmt.Errorf("an environment already runs from %s: run `clustermap-dev down` first", opts.StateDir)
	}
	if opts.Dataplane {
		if err := dataplane.Check(filepath.Join(opts.BinDir, "kube-proxy"), filepath.Join(opts.BinDir, "coredns")); err != nil {
			return nil, err
		}
	}
	if err := checkPorts(all); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	// The state goes down first, so that Down finds a crashed Up's leftovers.
	st := state{Prefix: opts.Prefix, Kubeconfig: opts.Kubeconfig, BinDir: opts.BinDir, Clusters: all}
	if err := writeJSON(filepath.Join(opts.StateDir, stateFile), st); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			fmt.Fprintf(opts.Log, "devenv: start failed, stopping what started: %v\n", err)
			if derr := Down(context.Background(), opts.StateDir, opts.Log); derr != nil {
				err = fmt.Errorf("%w (and cleanup failed: %v)", err, derr)
			}
		}
	}()

	if opts.Dataplane {
		if err := startFabric(ctx, opts, specs); err != nil {
			return nil, err
		}
	}
	env = &Env{Options: opts, Clusters: make([]*Cluster, len(specs))}
	for i, s := range specs {
		env.Clusters[i], err = startCluster(ctx, opts, s)
		if errors.Is(err, errComponentExited) {
			// Seen once in many runs with an empty log: start it again.
			fmt.Fprintf(opts.Log, "devenv: %v; starting %s once more\n", err, s.ID)
			if derr := stopCluster(ctx, opts.BinDir, opts.StateDir, s.KwokName, opts.Log); derr != nil {
				return nil, fmt.Errorf("%w (and removing it failed: %v)", err, derr)
			}
			env.Clusters[i], err = startCluster(ctx, opts, s)
		}
		if err != nil {
			return nil, err
		}
	}
	if opts.Hub {
		if err := env.startHub(ctx); err != nil {
			return nil, err
		}
	}
	if err := env.writeKubeconfig(); err != nil {
		return nil, err
	}
	return env, nil
}

// withHub is every cluster of the environment, the hub's too.
func (e *Env) withHub() []*Cluster {
	if e.HubCluster == nil {
		return e.Clusters
	}
	return append(slices.Clip(e.Clusters), e.HubCluster)
}

// startHub starts the hub cluster (initialised by prepare) and joins every
// member to it.
func (e *Env) startHub(ctx context.Context) error {
	o := e.Options
	o.Dataplane = false // the hub runs no pods
	c, err := startCluster(ctx, o, HubSpec(e.Prefix, e.PortBase))
	if err != nil {
		return err
	}
	e.HubCluster, e.HubKubeconfigs = c, map[string]string{}
	dir := filepath.Join(e.StateDir, "hub")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, m := range e.Clusters {
		data, _, err := hub.Join(ctx, c.Config, e.ClusterSet, m.ID, "", "", 24*time.Hour)
		if err != nil {
			return fmt.Errorf("joining %s to the hub: %w", m.ID, err)
		}
		path := filepath.Join(dir, m.ID+".kubeconfig")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
		e.HubKubeconfigs[m.ID] = path
	}
	return nil
}

// writeKubeconfig merges the clusters into one file, a context per cluster id,
// credentials inlined so that the file stands on its own.
func (e *Env) writeKubeconfig() error {
	out := clientcmdapi.NewConfig()
	for _, c := range e.withHub() {
		kc, err := clientcmd.LoadFromFile(filepath.Join(kwokClusterDir(e.StateDir, c.KwokName), "kubeconfig.yaml"))
		if err != nil {
			return err
		}
		if err := clientcmdapi.FlattenConfig(kc); err != nil {
			return err
		}
		kctx := kc.Contexts[kc.CurrentContext]
		if kctx == nil {
			return fmt.Errorf("kwokctl's kubeconfig for %s has no current context", c.ID)
		}
		out.Clusters[c.ID] = kc.Clusters[kctx.Cluster]
		out.AuthInfos[c.ID] = kc.AuthInfos[kctx.AuthInfo]
		out.Contexts[c.ID] = &clientcmdapi.Context{Cluster: c.ID, AuthInfo: c.ID, Namespace: "default"}
	}
	out.CurrentContext = e.Clusters[0].ID
	if err := os.MkdirAll(filepath.Dir(e.Kubeconfig), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*out, e.Kubeconfig)
}
