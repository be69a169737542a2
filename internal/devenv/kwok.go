//go:build linux

// One cluster's life under kwokctl's binary runtime: its kwok
// configuration, start (watched until it is ready or stops trying), stop
// and restart, and its kubeconfig.

package devenv

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

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

// letGo releases the ports of a cluster StopCluster stopped.
func letGo(dir string) {
	stopped.Lock()
	defer stopped.Unlock()
	if release := stopped.release[dir]; release != nil {
		release()
		delete(stopped.release, dir)
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
