//go:build linux

package devenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// lockCreates serializes cluster creation across every process of the
// machine. kwokctl picks each free port by counting down from 32767 and
// probing, so two concurrent creates pick the same etcd port and the second
// apiserver silently joins the first one's etcd. Holding this lock until a
// cluster's components listen makes the next create see those ports taken.
func lockCreates(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "clustermap-devenv.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// kwokPorts reads the host ports a kwokctl cluster's components listen on
// from the configuration kwokctl saved in its directory (options.*Port:
// etcd, etcd peer, apiserver, controller manager, scheduler, kwok).
func kwokPorts(clusterDir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(clusterDir, "kwok.yaml"))
	if err != nil {
		return nil, err
	}
	var ports []int
	for _, doc := range strings.Split(string(data), "\n---") {
		var saved struct {
			Kind    string         `json:"kind"`
			Options map[string]any `json:"options"`
		}
		if err := yaml.Unmarshal([]byte(doc), &saved); err != nil || saved.Kind != "KwokctlConfiguration" {
			continue
		}
		for k, v := range saved.Options {
			if n, ok := v.(float64); ok && n > 0 && strings.HasSuffix(k, "Port") {
				ports = append(ports, int(n))
			}
		}
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("no ports in %s", filepath.Join(clusterDir, "kwok.yaml"))
	}
	sort.Ints(ports)
	return ports, nil
}

// holdPorts listens on every port (all addresses, as kwokctl probes them)
// until release is called. A component still exiting may hold a port a
// moment after kwokctl stop returns: each is tried for up to 10 s.
func holdPorts(ctx context.Context, ports []int) (release func(), err error) {
	var held []net.Listener
	release = func() {
		for _, l := range held {
			l.Close()
		}
	}
	for _, p := range ports {
		deadline := time.Now().Add(10 * time.Second)
		for {
			l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err == nil {
				held = append(held, l)
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				release()
				return nil, fmt.Errorf("holding port %d of a stopped cluster: %w", p, errors.Join(err, ctx.Err()))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return release, nil
}
