//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
)

// newDevNode is a cluster's data plane node, run by kwokctl as a component
// of the cluster.
func newDevNode() *cobra.Command {
	var o dataplane.NodeOptions
	var fabricPath string
	cmd := &cobra.Command{
		Use:    "node",
		Short:  "Run one local cluster's data plane node: kube-proxy, DNS and the pods' namespaces",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var err error
			if o.Fabric, err = dataplane.Load(fabricPath); err != nil {
				return err
			}
			if o.Self, err = os.Executable(); err != nil {
				return err
			}
			o.LogDir = filepath.Dir(o.Kubeconfig)
			o.NodeKubeconfig = filepath.Join(o.LogDir, "node-kubeconfig.yaml")
			if err := devenv.WriteNodeKubeconfig(o.Kubeconfig, o.NodeKubeconfig, o.Fabric.HostAddr().String()); err != nil {
				return err
			}
			cs, err := componentClient(o.Kubeconfig)
			if err != nil {
				return err
			}
			return dataplane.RunNode(ctx, cs, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster, from the host")
	f.StringVar(&fabricPath, "fabric", "", "the environment's fabric.json")
	f.StringVar(&o.Cluster, "cluster", "", "cluster id")
	f.StringVar(&o.KubeProxy, "kube-proxy", "", "kube-proxy binary")
	f.StringVar(&o.Clustermap, "clustermap", "", "clustermap binary (its DNS server runs in the node)")
	f.StringVar(&o.CoreDNS, "coredns", "", "CoreDNS binary (the cluster's DNS, forwarding clusterset.local to clustermap's)")
	f.BoolVar(&o.AllPods, "all-pods", false, "run every pod (but those on the host's network), not only the annotated ones")
	return cmd
}

func parsePorts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("bad port %q", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// newDevPodServer is the server of a data plane pod.
func newDevPodServer() *cobra.Command {
	var id dataplane.Identity
	var tcp, udp string
	cmd := &cobra.Command{
		Use:    "podserver",
		Short:  "Answer HTTP on TCP ports and echo on UDP ports with the pod's name and cluster",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			t, err := parsePorts(tcp)
			if err != nil {
				return err
			}
			u, err := parsePorts(udp)
			if err != nil {
				return err
			}
			return dataplane.Serve(ctx, id, t, u)
		},
	}
	f := cmd.Flags()
	f.StringVar(&id.Pod, "pod", "", "pod name")
	f.StringVar(&id.Namespace, "namespace", "", "pod namespace")
	f.StringVar(&id.Cluster, "cluster", "", "cluster id")
	f.StringVar(&tcp, "tcp", "80", "TCP ports (HTTP), comma-separated")
	f.StringVar(&udp, "udp", "", "UDP ports (echo), comma-separated")
	return cmd
}

// newDevPodExec starts a pod's process with its service account's files
// mounted: the node agent runs it inside `ip netns exec`.
func newDevPodExec() *cobra.Command {
	var credentials string
	cmd := &cobra.Command{
		Use:    "pod-exec --serviceaccount DIR -- COMMAND...",
		Short:  "Mount a pod's service account files and run its command",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, argv []string) error {
			return dataplane.MountAndExec(credentials, argv)
		},
	}
	cmd.Flags().StringVar(&credentials, "serviceaccount", "", "directory of the token, ca.crt and namespace")
	return cmd
}

// newDevProbe asks every URL until it answers, printing when each first
// did: run inside a pod (kubectl exec), it times what a client there sees.
func newDevProbe() *cobra.Command {
	var interval, timeout time.Duration
	cmd := &cobra.Command{
		Use:    "probe URL...",
		Short:  "Ask every URL until it answers; print each URL with the time of its first answer",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, urls []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			hc := &http.Client{Timeout: time.Second}
			var mu sync.Mutex
			var wg sync.WaitGroup
			missing := 0
			for _, u := range urls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						if resp, err := hc.Get(u); err == nil {
							resp.Body.Close()
							if resp.StatusCode == http.StatusOK {
								mu.Lock()
								fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", u, time.Now().Format(time.RFC3339Nano))
								mu.Unlock()
								return
							}
						}
						select {
						case <-ctx.Done():
							mu.Lock()
							missing++
							mu.Unlock()
							return
						case <-time.After(interval):
						}
					}
				}()
			}
			wg.Wait()
			if missing > 0 {
				return fmt.Errorf("%d of %d URLs did not answer within %v", missing, len(urls), timeout)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 100*time.Millisecond, "pause between tries of one URL")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after")
	return cmd
}
