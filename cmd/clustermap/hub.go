package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/registry/hub"
)

// newHub is `clustermap hub`: a Kubernetes cluster as the clusterset's
// registry in place of Cloud Map (docs/hub.md).
func newHub() *cobra.Command {
	var kubeconfig, kctx, clusterSet string
	cmd := &cobra.Command{
		Use:   "hub",
		Short: "Make a Kubernetes cluster the clusterset's registry (in place of Cloud Map) and let members join it",
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual loading rules)")
	pf.StringVar(&kctx, "context", "", "the hub cluster's context, as an admin (default: the current context)")
	pf.StringVar(&clusterSet, "clusterset", "", "the clusterset's id (every member's clusterset.k8s.io ClusterProperty)")
	needSet := func() error {
		if clusterSet == "" {
			return fmt.Errorf("--clusterset: name the clusterset (the members' clusterset.k8s.io ClusterProperty value)")
		}
		return nil
	}
	initCmd := &cobra.Command{
		Use:   "init --clusterset SET",
		Short: "Install on the hub the ClusterExport CRD, the clusterset's namespace, the members' Role and the admission policy that binds each record to its member",
		Long: `Run once per clusterset against the hub cluster, as an admin; running it
again upgrades what it installed. The members' records live in the
namespace clusterset-<SET>. The admission policy (a
ValidatingAdmissionPolicy, Kubernetes 1.30 or later) lets a member
(ServiceAccount member-<cluster>) write only the ClusterExports of its own
cluster and its own Lease.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needSet(); err != nil {
				return err
			}
			cfg, err := adminConfig(kubeconfig, kctx)
			if err != nil {
				return err
			}
			if err := hub.Init(cmd.Context(), cfg, clusterSet); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "hub ready for clusterset %s in namespace %s: add members with clustermap hub join\n", clusterSet, hub.Namespace(clusterSet))
			return nil
		},
	}
	var server, out, region string
	var ttl time.Duration
	var leave bool
	joinCmd := &cobra.Command{
		Use:   "join CLUSTER --clusterset SET",
		Short: "Make CLUSTER a member and write its least-privilege, expiring kubeconfig for the hub",
		Long: `Run against the hub, as an admin, once per member cluster (CLUSTER is its
cluster.clusterset.k8s.io id). It makes the ServiceAccount member-CLUSTER in
the clusterset's namespace, binds it to the members' Role, and writes a
kubeconfig with a token that expires after --ttl. Give it to that
cluster's controller (--registry=hub --hub-kubeconfig FILE, or the
chart's hub.kubeconfigSecret). Run it again before the expiry for a new
token; --leave deletes the ServiceAccount, ending every token issued for
it (its records stay until clustermap forget-cluster). --region names the
Region the member is in, for local-first routing: every member reads it,
and no member can change it (give it at every join: a join without it
removes it).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needSet(); err != nil {
				return err
			}
			cfg, err := adminConfig(kubeconfig, kctx)
			if err != nil {
				return err
			}
			if leave {
				c, err := clusterClient(kubeconfig, kctx)
				if err != nil {
					return err
				}
				if err := hub.Leave(cmd.Context(), c, clusterSet, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s left clusterset %s: its ServiceAccount is deleted\n", args[0], clusterSet)
				return nil
			}
			data, expiry, err := hub.Join(cmd.Context(), cfg, clusterSet, args[0], region, server, ttl)
			if err != nil {
				return fmt.Errorf("%w (--server names the https:// address members reach the hub at)", err)
			}
			if err := writeOutput(cmd, out, data); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kubeconfig for member %s of clusterset %s; the token expires %s: run this again before then\n",
				args[0], clusterSet, expiry.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := joinCmd.Flags()
	f.StringVar(&server, "server", "", "the https:// address members reach the hub at (default: the context's)")
	f.DurationVar(&ttl, "ttl", 30*24*time.Hour, "how long the token is valid (at least 10m)")
	f.StringVarP(&out, "output", "o", "-", "file to write the kubeconfig to (mode 0600; - for stdout)")
	f.BoolVar(&leave, "leave", false, "delete the member's access instead")
	f.StringVar(&region, "region", "", "the Region the member is in (a DNS label, such as us-east-1), which the hub vouches for to every member's local-first routing (default: none, every member counts as in one Region)")
	cmd.AddCommand(initCmd, joinCmd)
	return cmd
}
