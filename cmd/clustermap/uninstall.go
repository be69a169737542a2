package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/uninstall"
	"github.com/clustermap/clustermap/internal/withdraw"
)

func newUninstall() *cobra.Command {
	var namespace, phase string
	var targets clusterFlags
	var force bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Withdraw everything clustermap published and delete what it made, before its CRDs and controller go",
		Long: `Run before helm uninstall (or kubectl delete -k), with the controllers still
running, over every cluster being uninstalled (--context, repeatable, or
--all-contexts):

1. withdraw: the Lease ` + withdraw.LeaseName + ` in --namespace asks the running
   controller to take every export's records and every Cloud Map DNS
   registration out of Cloud Map and drop its finalizers. ServiceExports
   and annotated Services are not deleted or changed: they are their
   owners', and other controllers may serve them. Waits until no
   clustermap finalizer is left.
2. stop: the controller Deployments (label ` + uninstall.ControllerLabel + `)
   in --namespace are scaled to 0.
3. cleanup: ServiceImports, derived Services, EndpointSlices and replicas
   clustermap made are deleted, and its status Lease and the withdrawal
   request (a later install publishes again).

Afterwards nothing holds a clustermap finalizer: helm uninstall and deleting
the CRDs finish at once. --phase runs one step only; --force drops
finalizers a stopped controller cannot remove (their Cloud Map records
stay, and are named).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if phase != "all" && phase != "withdraw" && phase != "stop" && phase != "cleanup" {
				return fmt.Errorf("--phase %q: want all, withdraw, stop or cleanup", phase)
			}
			contexts, err := targets.pick()
			if err != nil {
				return err
			}
			var clusters []uninstall.Cluster
			for _, kctx := range contexts {
				cl, err := clusterClient(targets.kubeconfig, kctx)
				if err != nil {
					return err
				}
				clusters = append(clusters, uninstall.Cluster{Name: contextName(kctx), Client: cl})
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 3*timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			// Each phase over every cluster before the next: exports are
			// withdrawn everywhere while every controller still runs, so
			// that each removes its imports of the others' exports.
			if phase == "all" || phase == "withdraw" {
				for _, c := range clusters {
					if err := uninstall.Withdraw(ctx, c, namespace, timeout, out); err != nil && !force {
						return err
					}
				}
			}
			if phase == "all" || phase == "stop" {
				for _, c := range clusters {
					if err := uninstall.Stop(ctx, c, namespace, timeout, out); err != nil {
						return err
					}
				}
			}
			if phase == "all" || phase == "cleanup" {
				for _, c := range clusters {
					if _, err := uninstall.Cleanup(ctx, c, namespace, force, out); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	targets.add(f, "kubeconfig contexts of the clusters to uninstall from")
	f.StringVar(&namespace, "namespace", kube.DefaultStatusNamespace, "the controller's namespace")
	f.StringVar(&phase, "phase", "all", "all, or one of withdraw, stop, cleanup")
	f.BoolVar(&force, "force", false, "drop finalizers a stopped controller cannot remove (their Cloud Map records stay)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long each phase may wait")
	return cmd
}
