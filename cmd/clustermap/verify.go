package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/probe"
	"github.com/clustermap/clustermap/internal/verify"
	"github.com/clustermap/clustermap/internal/version"
)

func newVerify() *cobra.Command {
	var output string
	var clusters clusterFlags
	o := verify.Options{}
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check the data plane between clusters: a probe exported from each, reached from each by DNS, TCP and UDP",
		Long: `Deploys a short-lived probe (clustermap's image, as server and client) in a
new namespace of each cluster (one per --context; --all-contexts for every
context of the kubeconfig), exports it, waits for every cluster to import
every probe, then checks from each cluster to every other: the clusterset
names (A, AAAA, SRV, the headless name and each cluster's per-pod name),
TCP and UDP to each cluster's probe pod directly and through the
clusterset IP, in every IP family. Prints a matrix, then each failure with
its likely cause (DNS not forwarded, an import missing, a route or a
security group, the Service proxy). The namespaces are deleted whatever
happens (--keep leaves them). Exits non-zero when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			names, err := clusters.pick()
			if err != nil {
				return err
			}
			var targets []verify.Target
			for _, n := range names {
				cfg, err := kube.RESTConfig(clusters.kubeconfig, n)
				if err != nil {
					return fmt.Errorf("context %s: %w", contextName(n), err)
				}
				cfg.Timeout = 30 * time.Second
				targets = append(targets, verify.Target{Context: contextName(n), Config: cfg})
			}
			o.Log = func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			rep, err := verify.Run(ctx, targets, o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = verify.Table(out, rep)
			}
			if err != nil {
				return err
			}
			if len(rep.Failures) > 0 {
				return fmt.Errorf("%d failures (%d checks ran)", len(rep.Failures), rep.Checks)
			}
			return nil
		},
	}
	f := cmd.Flags()
	clusters.add(f, "kubeconfig contexts, one per cluster (repeat or comma-separate)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.StringVar(&o.Image, "image", "ghcr.io/clustermap/clustermap:"+version.Version, "the probe's image: clustermap's, of a version with `clustermap probe`")
	f.StringVar(&o.Zone, "zone", "clusterset.local", "the clusterset DNS zone")
	f.StringVar(&o.Namespace, "namespace", "", "the namespace to make (and delete) in every cluster (default: clustermap-verify-<random>)")
	f.DurationVar(&o.Wait, "wait", 3*time.Minute, "how long the probes may take to run and be imported everywhere")
	f.BoolVar(&o.Keep, "keep", false, "leave the namespaces in place, to look at what failed")
	return cmd
}

// newProbe is what `verify` runs in its pods; not for people.
func newProbe() *cobra.Command {
	cmd := &cobra.Command{Use: "probe", Short: "The server and client `clustermap verify` runs in each cluster", Hidden: true}
	var port int
	var cluster, pod string
	serve := &cobra.Command{
		Use: "serve", Short: "Answer TCP connections and UDP datagrams with this cluster and pod", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return probe.Serve(ctx, port, cluster, pod)
		},
	}
	serve.Flags().IntVar(&port, "port", verify.Port, "TCP and UDP port")
	serve.Flags().StringVar(&cluster, "cluster", "", "this cluster's id")
	serve.Flags().StringVar(&pod, "pod", "", "this pod's name")
	var resolvConf string
	var timeout time.Duration
	check := &cobra.Command{
		Use: "check", Short: "Run the checks read as JSON from stdin; print the results as JSON", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var checks []probe.Check
			if err := json.NewDecoder(cmd.InOrStdin()).Decode(&checks); err != nil {
				return fmt.Errorf("reading the checks: %w", err)
			}
			servers, err := probe.Servers(resolvConf)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(probe.Run(context.Background(), checks, servers, timeout))
		},
	}
	check.Flags().StringVar(&resolvConf, "resolv-conf", "/etc/resolv.conf", "where the pod's name servers are")
	check.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "for each lookup and each dial")
	cmd.AddCommand(serve, check)
	return cmd
}
