package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/hub"
)

func newForgetCluster() *cobra.Command {
	var o cloudmap.ForgetOptions
	var co cloudmapclient.Options
	var hubKubeconfig, hubContext string
	cmd := &cobra.Command{
		Use:   "forget-cluster CLUSTER",
		Short: "Remove a cluster gone for good from the clusterset: its Cloud Map records, hence its endpoints in every import",
		Long: `A cluster deleted without clustermap uninstall leaves its records in Cloud
Map; importers drain it once it is silent past --silent-cluster-ttl, and
keep it in their imports. forget-cluster deregisters every record it left in
the clusterset's namespaces of one Region (--region; run it per Region it
exported to), then its proof-of-life record: every importer then drops it.

It refuses a cluster that proved alive within --silent-cluster-ttl (--force
to forget it anyway). Across accounts run it as the owner account
(--cloudmap-owner-account): only the owner may deregister another
account's records. --only-clustermap keeps the records another controller
wrote under the cluster's id (going back to the AWS Cloud Map MCS
controller: docs/migrate-from-aws-controller.md). AWS credentials come from
the standard chain.

A clusterset whose registry is a hub cluster (docs/hub.md): --hub-kubeconfig
names an admin kubeconfig of the hub; the cluster's ClusterExports, its
Lease and its access (ServiceAccount) are deleted there.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.ClusterSet == "" {
				return fmt.Errorf("--clusterset is required: the clusterset's id (the clusterset.k8s.io ClusterProperty)")
			}
			o.Cluster = args[0]
			if hubKubeconfig != "" {
				cfg, err := kube.RESTConfig(hubKubeconfig, hubContext)
				if err != nil {
					return err
				}
				n, err := hub.Forget(cmd.Context(), cfg, o.ClusterSet, o.Cluster, o.SilentAfter, o.Force)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "cluster %s forgotten on the hub: %d ClusterExports deleted, its Lease and access gone\n", o.Cluster, n)
				return nil
			}
			c, err := cloudmapclient.New(cmd.Context(), co)
			if err != nil {
				return err
			}
			n, err := cloudmap.Forget(cmd.Context(), c, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s forgotten in %s: %d records deregistered\n", o.Cluster, c.Options().Region, n)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ClusterSet, "clusterset", "", "the clusterset's id")
	f.StringVar(&hubKubeconfig, "hub-kubeconfig", "", "a clusterset whose registry is a hub cluster: an admin kubeconfig of the hub (its records, Lease and access are removed there, not in Cloud Map)")
	f.StringVar(&hubContext, "hub-context", "", "with --hub-kubeconfig: the hub's context (default: the current one)")
	f.StringVar(&o.Owner, "cloudmap-owner-account", "", "across accounts: the account owning the clusterset's namespaces (run as it)")
	f.DurationVar(&o.SilentAfter, "silent-cluster-ttl", cloudmap.DefaultSilentAfter, "refuse a cluster that proved alive more recently than this")
	f.BoolVar(&o.Force, "force", false, "forget the cluster even if it proved alive recently (its records are gone over again about 15 s later: writes it had under way show only once they end)")
	f.BoolVar(&o.OnlyClustermap, "only-clustermap", false, "deregister only the records clustermap wrote (and its proof of life), keeping another controller's under the same cluster id: the way back to the AWS Cloud Map MCS controller")
	f.StringVar(&co.Region, "region", "", "the AWS Region whose records to remove (default: AWS_REGION, the shared config)")
	f.StringVar(&co.Endpoint, "cloudmap-endpoint", "", "Cloud Map endpoint URL (default: the AWS endpoint of the Region)")
	return cmd
}
