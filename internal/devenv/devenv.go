//go:build linux

// Package devenv starts and stops local Kubernetes clusters for the demo,
// tests and benchmarks: real kube-apiservers and etcd run by kwokctl's binary
// runtime from ./bin, with simulated nodes and pods from kwok.
package devenv

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
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
	Log                io.Writer
}

// Env is a running environment.
type Env struct {
	Options
	Clusters []*Cluster
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
			return fmt.Errorf("port %d for %s is in use: stop whatever listens there, or choose other ports with --port-base", s.APIServerPort, s.ID)
		}
		l.Close()
	}
	return nil
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
	if err := checkPorts(specs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	// The state goes down first, so that Down finds a crashed Up's leftovers.
	st := state{Prefix: opts.Prefix, Kubeconfig: opts.Kubeconfig, BinDir: opts.BinDir, Clusters: specs}
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
	if err := env.writeKubeconfig(); err != nil {
		return nil, err
	}
	return env, nil
}

func startCluster(ctx context.Context, opts Options, s ClusterSpec) (*Cluster, error) {
	cfgPath := filepath.Join(opts.StateDir, s.ID+".kwok.yaml")
	kubeconfig := filepath.Join(kwokClusterDir(opts.StateDir, s.KwokName), "kubeconfig.yaml")
	v := kwokValues{ServiceCIDRs: strings.Join(s.ServiceCIDRs, ","), IPv6Primary: strings.Contains(s.ServiceCIDRs[0], ":"),
		DevBinary: filepath.Join(opts.BinDir, DevBinary), Kubeconfig: kubeconfig, WorkDir: filepath.Dir(kubeconfig)}
	if opts.Dataplane {
		if err := nodeComponent(opts, s, &v); err != nil {
			return nil, err
		}
	}
	kwokCfg, err := kwokConfig(v)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgPath, []byte(kwokCfg), 0o644); err != nil {
		return nil, err
	}
	args := []string{"create", "cluster", "--name", s.KwokName, "--runtime", "binary",
		"--config", cfgPath, "--kubeconfig", "",
		"--kube-apiserver-binary", filepath.Join(opts.BinDir, "kube-apiserver"),
		"--kube-controller-manager-binary", filepath.Join(opts.BinDir, "kube-controller-manager"),
		"--kube-scheduler-binary", filepath.Join(opts.BinDir, "kube-scheduler"),
		"--kwok-controller-binary", filepath.Join(opts.BinDir, "kwok"),
		"--etcd-binary", filepath.Join(opts.BinDir, "etcd"),
		// A lab cluster is thrown away, never recovered from disk: an fsync
		// stalled by the disk (seen: "etcdserver: request timed out" and a
		// lost leader election while a test suite ran) buys it nothing.
		"--extra-args", "etcd=unsafe-no-fsync=true",
	}
	if s.APIServerPort != 0 {
		args = append(args, "--kube-apiserver-port", strconv.Itoa(s.APIServerPort))
	}
	unlock, err := lockCreates(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	fmt.Fprintf(opts.Log, "devenv: starting %s\n", s.ID)
	if err := createWatched(ctx, opts, s, args); err != nil {
		return nil, err
	}
	cfg, server, err := loadClusterConfig(kwokClusterDir(opts.StateDir, s.KwokName))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.ID, err)
	}
	c := &Cluster{ClusterSpec: s, Server: server, Config: cfg}
	if err := prepare(ctx, c, opts); err != nil {
		return nil, fmt.Errorf("preparing %s: %w", s.ID, err)
	}
	fmt.Fprintf(opts.Log, "devenv: %s ready at %s\n", s.ID, server)
	return c, nil
}

// createWatched runs kwokctl create, stopping it as soon as a component it
// started has exited: kwokctl itself would wait minutes for a dead apiserver.
func createWatched(ctx context.Context, opts Options, s ClusterSpec, args []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	died := make(chan error, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			if err := componentsAlive(kwokClusterDir(opts.StateDir, s.KwokName)); err != nil {
				died <- err
				cancel()
				return
			}
		}
	}()
	out, err := kwokctl(ctx, opts.BinDir, opts.StateDir, args...)
	select {
	case derr := <-died:
		return fmt.Errorf("starting %s: %w", s.ID, derr)
	default:
	}
	if err != nil {
		return fmt.Errorf("starting %s: %v\n%s", s.ID, err, tail(out, 20))
	}
	return nil
}

// kwokConfig gives the apiserver its service ranges, lifts the components'
// client rate limits, runs the dev environment's pod IPAM (and, with a data
// plane, its node agent) as components of the cluster (started and stopped
// with it), and replaces kwok's pod stages by ones that wait for the IPAM's
// addresses: kwok's own allocator is IPv4-only and reuses addresses at once.
//
//go:embed kwok.yaml.tmpl
var kwokTemplateText string

var kwokTemplate = template.Must(template.New("kwok").Parse(kwokTemplateText))

// kwokValues fill kwok.yaml.tmpl.
type kwokValues struct {
	ServiceCIDRs string
	// IPv6Primary: the apiserver's address must be of the primary service
	// family; kwok gives it 192.0.2.2, so an IPv6-only cluster gets the
	// IPv6 documentation address instead (nothing dials it).
	IPv6Primary                    bool
	DevBinary, Kubeconfig, WorkDir string
	// The node agent's, set with a data plane.
	NodeBinary, Fabric, Cluster, KubeProxy, CoreDNS, Clustermap string
	AllPods                                                     bool
	CertSANs                                                    []string
}

func kwokConfig(v kwokValues) (string, error) {
	var b strings.Builder
	err := kwokTemplate.Execute(&b, v)
	return b.String(), err
}

func kwokWorkdir(stateDir string) string { return filepath.Join(stateDir, "kwok") }

func kwokClusterDir(stateDir, name string) string {
	return filepath.Join(kwokWorkdir(stateDir), "clusters", name)
}

func kwokctl(ctx context.Context, binDir, stateDir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kwokctl"), args...)
	// kwokctl keeps its clusters under KWOK_WORKDIR: one per environment, so
	// that a demo and tests never see each other's clusters.
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+kwokWorkdir(stateDir))
	// Cancelled, its whole process group goes: kwokctl's helpers (a kubectl
	// polling a starting apiserver) outlived it otherwise. The components it
	// starts have sessions of their own, stopped from their pid files.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd.CombinedOutput()
}

func loadClusterConfig(dir string) (*rest.Config, string, error) {
	kc, err := clientcmd.LoadFromFile(filepath.Join(dir, "kubeconfig.yaml"))
	if err != nil {
		return nil, "", fmt.Errorf("reading kwokctl's kubeconfig: %w", err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		return nil, "", err
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg, cfg.Host, nil
}

// writeKubeconfig merges the clusters into one file, a context per cluster id,
// credentials inlined so that the file stands on its own.
func (e *Env) writeKubeconfig() error {
	out := clientcmdapi.NewConfig()
	for _, c := range e.Clusters {
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

// Down stops every cluster of the environment in stateDir and removes its
// files. Stopping nothing is not an error.
func Down(ctx context.Context, stateDir string, log io.Writer) error {
	if log == nil {
		log = io.Discard
	}
	var st state
	data, err := os.ReadFile(filepath.Join(stateDir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(log, "devenv: nothing runs from %s\n", stateDir)
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(stateDir, stateFile), err)
	}
	// Every cluster kwokctl knows in this workdir goes, listed or not: a
	// crashed Up may have left one the state does not name yet.
	entries, _ := os.ReadDir(filepath.Join(kwokWorkdir(stateDir), "clusters"))
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := stopCluster(ctx, st.BinDir, stateDir, e.Name(), log); err != nil {
			errs = append(errs, err)
		}
	}
	// The data plane goes whether Up recorded it or died before: its
	// names derive from the state directory.
	if abs, err := filepath.Abs(stateDir); err == nil {
		errs = append(errs, dataplane.Teardown(ctx, dataplane.TagOf(abs)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if st.Kubeconfig != "" && !strings.HasPrefix(st.Kubeconfig, stateDir+string(filepath.Separator)) {
		if err := os.Remove(st.Kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.RemoveAll(stateDir)
}

// stopCluster deletes one kwok cluster and makes sure its processes are gone.
func stopCluster(ctx context.Context, binDir, stateDir, name string, log io.Writer) error {
	pids := readPids(filepath.Join(kwokClusterDir(stateDir, name), "pids"))
	fmt.Fprintf(log, "devenv: stopping %s\n", name)
	if out, err := kwokctl(ctx, binDir, stateDir, "delete", "cluster", "--name", name); err != nil {
		fmt.Fprintf(log, "devenv: kwokctl delete %s: %v\n%s\n", name, err, tail(out, 10))
	}
	if err := reap(pids); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Pids lists the processes of the environment's clusters.
func (e *Env) Pids() []int {
	var all []int
	for _, c := range e.Clusters {
		all = append(all, readPids(filepath.Join(kwokClusterDir(e.StateDir, c.KwokName), "pids"))...)
	}
	return all
}

// Down stops the environment.
func (e *Env) Down(ctx context.Context) error {
	for _, c := range e.Clusters {
		letGo(kwokClusterDir(e.StateDir, c.KwokName))
	}
	return Down(ctx, e.StateDir, e.Log)
}

// letGo releases the ports of a cluster StopCluster stopped.
func letGo(dir string) {
	stopped.Lock()
	defer stopped.Unlock()
	if release := stopped.release[dir]; release != nil {
		release()
		delete(stopped.release, dir)
	}
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func tail(out []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// permanent marks an error that no amount of waiting will cure.
type permanent struct{ error }

// waitFor polls cond every interval until it holds, fails permanently, or ctx ends.
func waitFor(ctx context.Context, what string, interval time.Duration, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if p, isPermanent := err.(permanent); isPermanent {
			return false, p.error
		}
		if err != nil {
			last = err
		}
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil:
		return err // permanent
	case last != nil:
		return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
	default:
		return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

// StopCluster stops one cluster's components, keeping its state, as an
// outage; StartCluster brings it back on the same address. While it is down
// its ports stay held by this process: kwokctl counts down from 32767 to the
// first free port, so a cluster created meanwhile by another test process
// would take them and the stopped one would come back to find its apiserver
// port answered by a stranger.
func (e *Env) StopCluster(ctx context.Context, c *Cluster) error {
	out, err := kwokctl(ctx, e.BinDir, e.StateDir, "stop", "cluster", "--name", c.KwokName)
	if err != nil {
		return fmt.Errorf("stopping %s: %w: %s", c.ID, err, tail(out, 10))
	}
	dir := kwokClusterDir(e.StateDir, c.KwokName)
	ports, err := kwokPorts(dir)
	if err != nil {
		return fmt.Errorf("stopping %s: %w", c.ID, err)
	}
	release, err := holdPorts(ctx, ports)
	if err != nil {
		return fmt.Errorf("stopping %s: %w", c.ID, err)
	}
	stopped.Lock()
	defer stopped.Unlock()
	stopped.release[dir] = release
	return nil
}

// StartCluster restarts a cluster stopped by StopCluster. Its ports are let
// go under the create lock, so no create can pick them before it listens.
func (e *Env) StartCluster(ctx context.Context, c *Cluster) error {
	unlock, err := lockCreates(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	letGo(kwokClusterDir(e.StateDir, c.KwokName))
	out, err := kwokctl(ctx, e.BinDir, e.StateDir, "start", "cluster", "--name", c.KwokName)
	if err != nil {
		return fmt.Errorf("starting %s: %w: %s", c.ID, err, tail(out, 10))
	}
	return nil
}

// PeerDirs writes, for every cluster, a directory under root holding the
// kubeconfigs of the other clusters, named <id>.yaml: what
// `controller --syndicate --peers-dir` reads. Each grants what access says
// (For and Namespace filled in), as `clustermap peer-kubeconfig` does, for
// a day. It returns them by cluster id.
func (e *Env) PeerDirs(ctx context.Context, root string, access replication.PeerAccess) (map[string]string, error) {
	if access.Namespace == "" {
		access.Namespace = kube.DefaultStatusNamespace
	}
	dirs := map[string]string{}
	for _, c := range e.Clusters {
		dir := filepath.Join(root, c.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		for _, peer := range e.Clusters {
			if peer == c {
				continue
			}
			access.For = c.ID
			data, _, err := replication.IssuePeerKubeconfig(ctx, peer.Config, peer.ID, "", access, 24*time.Hour)
			if err != nil {
				return nil, fmt.Errorf("access of %s to %s: %w", c.ID, peer.ID, err)
			}
			if err := os.WriteFile(filepath.Join(dir, peer.ID+".yaml"), data, 0o600); err != nil {
				return nil, err
			}
		}
		dirs[c.ID] = dir
	}
	return dirs, nil
}
