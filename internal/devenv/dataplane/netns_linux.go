package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Where iproute2 keeps named namespaces and `ip netns exec` finds a
// namespace's own /etc files (its resolv.conf).
const (
	runNetns = "/run/netns"
	etcNetns = "/etc/netns"
)

// IPPath finds iproute2's ip: a component started by kwokctl may run with
// a PATH that lacks /usr/sbin.
func IPPath() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "ip"
}

// Check says what this machine lacks for a data plane (tools: the
// binaries its nodes run), and how to get it.
func Check(tools ...string) error {
	if os.Geteuid() != 0 {
		return errors.New("--dataplane makes network namespaces: run as root")
	}
	if _, err := os.Stat(IPPath()); err != nil {
		return errors.New("--dataplane needs iproute2's ip: apt-get install iproute2")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("--dataplane runs kube-proxy in nftables mode, which needs nft: run `make tools` (it installs the Debian package nftables)")
	}
	for _, t := range tools {
		if _, err := os.Stat(t); err != nil {
			return fmt.Errorf("%s is missing: run `make tools`", t)
		}
	}
	return nil
}

// Run runs steps, each the arguments of one ip command, in order.
func Run(ctx context.Context, steps [][]string) error {
	for _, s := range steps {
		out, err := exec.CommandContext(ctx, IPPath(), s...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Build picks the fabric a transit subnet that no other environment's
// uplink holds and builds it. Machine-wide lock: environments starting
// together pick different subnets. Teardown removes what a failed Build made.
func (f *Fabric) Build(ctx context.Context) error {
	l, err := os.OpenFile(filepath.Join(os.TempDir(), "clustermap-dataplane.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := syscall.Flock(int(l.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	if f.Subnet, err = freeSubnet(); err != nil {
		return err
	}
	return Run(ctx, f.Steps())
}

func freeSubnet() (int, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			b := p.Addr().As4()
			if b[0] == 198 && b[1] == 18 {
				used[int(b[2])] = true
			}
		}
	}
	for s := 1; s <= MaxSubnets; s++ {
		if !used[s] {
			return s, nil
		}
	}
	return 0, fmt.Errorf("all %d data plane subnets of 198.18.0.0/16 are in use: stop an environment (`clustermap-dev down`)", MaxSubnets)
}

// Save and Load keep the fabric beside the environment's state, where
// node agents read it.
func (f Fabric) Save(path string) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Load reads a fabric saved by Save.
func Load(path string) (Fabric, error) {
	var f Fabric
	data, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal(data, &f)
}

// Namespaces lists the named network namespaces whose names start with prefix.
func Namespaces(prefix string) []string {
	entries, _ := os.ReadDir(runNetns)
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Exists tells whether a named namespace exists.
func Exists(ns string) bool {
	_, err := os.Stat(filepath.Join(runNetns, ns))
	return err == nil
}

// DeleteNS kills every process in a namespace, waits for them to go, and
// deletes it with its /etc files; its links go with it.
func DeleteNS(ctx context.Context, ns string) error {
	if !Exists(ns) {
		return os.RemoveAll(filepath.Join(etcNetns, ns))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.CommandContext(ctx, IPPath(), "netns", "pids", ns).Output()
		if err != nil {
			return fmt.Errorf("listing the processes of %s: %w", ns, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %s in network namespace %s do not exit", strings.Join(pids, ","), ns)
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := Run(ctx, [][]string{{"netns", "del", ns}}); err != nil && Exists(ns) {
		return err
	}
	return os.RemoveAll(filepath.Join(etcNetns, ns))
}

// WriteResolvConf gives a namespace its own /etc/resolv.conf, which
// `ip netns exec` mounts over the host's.
func WriteResolvConf(ns, content string) error {
	dir := filepath.Join(etcNetns, ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(content), 0o644)
}

// Teardown removes everything an environment's data plane made, whether
// or not it still runs: its namespaces with their processes, links and
// rules, the host's uplink, the namespaces' /etc files.
func Teardown(ctx context.Context, tag string) error {
	f := Fabric{Tag: tag}
	var errs []error
	for _, ns := range Namespaces(f.Prefix()) {
		if err := DeleteNS(ctx, ns); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := net.InterfaceByName(f.Uplink()); err == nil {
		// Its peer end went with a namespace just deleted, and the kernel
		// removes the pair after `ip netns del` returns: gone meanwhile is
		// what was wanted.
		if err := Run(ctx, [][]string{{"link", "del", f.Uplink()}}); err != nil {
			if _, still := net.InterfaceByName(f.Uplink()); still == nil {
				errs = append(errs, err)
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(etcNetns, f.Prefix()+"*"))
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists what of an environment's data plane exists: namespaces,
// the uplink, /etc files. Empty after Teardown.
func Leftovers(tag string) []string {
	f := Fabric{Tag: tag}
	out := Namespaces(f.Prefix())
	if _, err := net.InterfaceByName(f.Uplink()); err == nil {
		out = append(out, "link "+f.Uplink())
	}
	dirs, _ := filepath.Glob(filepath.Join(etcNetns, f.Prefix()+"*"))
	return append(out, dirs...)
}

// InNS runs f on a thread moved into network namespace ns: sockets f makes
// belong to ns for good, whichever thread uses them later.
func InNS(ns string, f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(filepath.Join(runNetns, ns))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering %s: %w", ns, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime ends it with its goroutine.
		return errors.Join(ferr, fmt.Errorf("leaving %s: %w", ns, err))
	}
	runtime.UnlockOSThread()
	return ferr
}
