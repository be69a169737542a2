//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/devenv/ipam"
)

const defaultDevDir = ".clustermap/dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "clustermap-dev:", err)
		os.Exit(1)
	}
}

// newRoot is the dev environment's command: the lab, apart from the
// product binary users install (as kwokctl is apart from kwok).
func newRoot() *cobra.Command {
	dev := &cobra.Command{
		Use:           "clustermap-dev",
		Short:         "Local clusters (kwok) with clustermap and the Cloud Map emulator, for development, the demo and tests",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var (
		opts         devenv.Options
		stateIn      string
		cloudMapAddr string
	)
	up := &cobra.Command{
		Use:   "up",
		Short: "Start local clusters and write one kubeconfig with a context per cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opts.StateDir = stateIn
			opts.Log = cmd.ErrOrStderr()
			env, err := devenv.Up(ctx, opts)
			if err != nil {
				return err
			}
			printUsage(cmd, env)
			return nil
		},
	}
	up.Flags().IntVar(&opts.Clusters, "clusters", 2, "number of clusters")
	up.Flags().StringVar(&opts.Kubeconfig, "kubeconfig", "", "where to write the kubeconfig (default <state-dir>/kubeconfig)")
	up.Flags().IntVar(&opts.Nodes, "nodes", devenv.DefaultNodes, "simulated nodes per cluster")
	up.Flags().IntVar(&opts.PortBase, "port-base", 30700, "cluster i's apiserver listens on port-base+i (0: any free port)")
	up.Flags().StringVar(&opts.ClusterSet, "clusterset", devenv.DefaultClusterSet, "clusterset id set in every cluster's ClusterProperty")
	up.Flags().StringVar(&opts.BinDir, "bin-dir", devenv.BinDir(), "directory of the pinned tools (make tools)")

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop the local clusters and remove their files",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return devenv.Down(context.Background(), stateIn, cmd.ErrOrStderr())
		},
	}
	demo := &cobra.Command{
		Use:   "demo",
		Short: "Start the demo environment and keep it running until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opts.StateDir = stateIn
			opts.Log = cmd.ErrOrStderr()
			return runDemo(ctx, cmd, opts, cloudMapAddr)
		},
	}
	demo.Flags().IntVar(&opts.PortBase, "port-base", 30700, "cluster i's apiserver listens on port-base+i (0: any free port)")
	demo.Flags().StringVar(&opts.BinDir, "bin-dir", devenv.BinDir(), "directory of the pinned tools (make tools)")
	demo.Flags().StringVar(&cloudMapAddr, "cloudmap-listen", "127.0.0.1:4566", "address of the demo's Cloud Map emulator")

	up.Flags().StringVar(&opts.IPFamily, "ip-family", devenv.DualStack, "address families of pods and services: ipv4, ipv6 or dual")

	var ipamKubeconfig string
	ipamCmd := &cobra.Command{
		Use:    "ipam",
		Short:  "Assign pod addresses in one local cluster (run by kwokctl as a cluster component)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cs, err := componentClient(ipamKubeconfig)
			if err != nil {
				return err
			}
			return ipam.Run(ctx, cs)
		},
	}
	ipamCmd.Flags().StringVar(&ipamKubeconfig, "kubeconfig", "", "kubeconfig of the cluster")

	dev.PersistentFlags().StringVar(&stateIn, "state-dir", defaultDevDir, "directory holding the environment's files")
	up.Flags().BoolVar(&opts.Dataplane, "dataplane", false, dataplaneHelp)
	up.Flags().BoolVar(&opts.Hub, "hub", false, "start a hub cluster too (context hub), the clusterset's registry in place of Cloud Map, with each member's kubeconfig for it (docs/hub.md)")
	up.Flags().BoolVar(&opts.AllPods, "all-pods", false, "with --dataplane, network and run every pod (but those on the host's network), not only those annotated "+dataplane.Annotation+"=true")
	demo.Flags().BoolVar(&opts.Dataplane, "dataplane", true, "end with a real request from cluster-2 to cluster-1 (see dev up --dataplane, whose risks apply)")
	dev.AddCommand(up, down, demo, ipamCmd, newDevNode(), newDevPodServer(), newDevPodExec(), newDevProbe())
	return dev
}

// dataplaneHelp states what the data plane runs, and its risks.
const dataplaneHelp = `give every cluster a real network (needs root and nft): kube-proxy and clusterset DNS in a node namespace per cluster, and a network namespace per pod annotated ` + dataplane.Annotation + `=true (every pod with --all-pods) in which its containers' commands run, and kubectl exec and logs work.
DEV ONLY, RISKS: containers' commands and exec sessions run as HOST PROCESSES, as root, with the host's programs and files; only the network (and /etc/resolv.conf) is the pod's. Images are not pulled and nothing is isolated: anyone who can create a pod or exec into one in these clusters runs commands as root on this machine. Never point it at pod specs you do not trust.`

func printUsage(cmd *cobra.Command, env *devenv.Env) {
	w := cmd.OutOrStdout()
	abs, _ := filepath.Abs(env.Kubeconfig)
	fmt.Fprintf(w, "KUBECONFIG=%s\n", abs)
	fmt.Fprintf(w, "\n%d clusters of clusterset %s are ready. Use them with:\n", len(env.Clusters), env.ClusterSet)
	fmt.Fprintf(w, "  export KUBECONFIG=%s\n", abs)
	for _, c := range env.Clusters {
		fmt.Fprintf(w, "  kubectl --context %s get clusterproperties    # pods %s, services %s\n", c.ID, strings.Join(c.PodCIDRs, ","), strings.Join(c.ServiceCIDRs, ","))
	}
	if env.HubCluster != nil {
		fmt.Fprintf(w, "The hub (context hub) holds clusterset %s's registry; run each member's controller over it with:\n", env.ClusterSet)
		for _, c := range env.Clusters {
			fmt.Fprintf(w, "  clustermap controller --context %s --registry=hub --hub-kubeconfig %s\n", c.ID, env.HubKubeconfigs[c.ID])
		}
	}
	fmt.Fprintln(w, "Stop them with: clustermap-dev down")
}

// componentClient reaches a local cluster for a component kwokctl runs
// beside it, without client-side rate limits, as its controllers run.
func componentClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	return kubernetes.NewForConfig(cfg)
}
