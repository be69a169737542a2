package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
)

func newPeerKubeconfig() *cobra.Command {
	var kubeconfig, kctx, name, server, out string
	var a replication.PeerAccess
	var ttl time.Duration
	var revoke bool
	cmd := &cobra.Command{
		Use:   "peer-kubeconfig --context PEER --for CLUSTER",
		Short: "Grant another cluster's --syndicate controller least-privilege, expiring access to this one, and write its peer kubeconfig",
		Long: `Run against the peer (--context), once per cluster that replicates into it
(--for, that cluster's --cluster-name). It makes, in the peer, a
ServiceAccount for that cluster alone in --namespace, binds it to the
clustermap-peer ClusterRole (Services and EndpointSlices read and written,
orphaned Endpoints deleted, namespaces read: what replication does in a
peer and nothing else) in each of --namespaces (every namespace when none
are given), adds namespace creation only with --create-namespaces, and
the clustermap-peer admission policy (a ValidatingAdmissionPolicy: no
writes in kube-system, kube-public or kube-node-lease, and only to
Services and EndpointSlices labelled with the --for cluster's mark, but
for a migration's mode annotation), and
writes a kubeconfig with a token that expires after --ttl (or sooner where
the API server caps token lifetimes; the expiry is printed). Put the file
in the --for cluster's peers Secret under the peer's name (--name).

Run it again before the expiry to renew (the same access, a new token);
--revoke deletes the ServiceAccount, which ends every token issued for it.
When the token expires, the peer counts as down and its replicas are kept.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.For == "" {
				return fmt.Errorf("--for: name the cluster that will use the kubeconfig (its --cluster-name)")
			}
			cfg, err := adminConfig(kubeconfig, kctx)
			if err != nil {
				return err
			}
			if revoke {
				c, err := clusterClient(kubeconfig, kctx)
				if err != nil {
					return err
				}
				if err := replication.RevokePeer(cmd.Context(), c, a); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "access of %s to %s revoked: its ServiceAccount and bindings are deleted\n", a.For, contextName(kctx))
				return nil
			}
			if name == "" {
				name = kctx
			}
			data, expiry, err := replication.IssuePeerKubeconfig(cmd.Context(), cfg, name, server, a, ttl)
			if err != nil {
				return fmt.Errorf("%w (--server names the https:// address %s reaches this cluster at)", err, a.For)
			}
			if err := writeOutput(cmd, out, data); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kubeconfig for %s to reach %s as ServiceAccount %s/%s; the token expires %s: run this again before then\n",
				a.For, name, a.Namespace, a.ServiceAccountName(), expiry.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual loading rules)")
	f.StringVar(&kctx, "context", "", "the peer cluster's context, where access is granted (default: the current context)")
	f.StringVar(&a.For, "for", "", "the cluster that uses the kubeconfig, by its --cluster-name")
	f.StringVar(&name, "name", "", "the peer's name in the kubeconfig and the peers directory, its own --cluster-name (default: --context)")
	f.StringVar(&server, "server", "", "the https:// address the --for cluster reaches this one at (default: the context's)")
	f.StringVar(&a.Namespace, "namespace", kube.DefaultStatusNamespace, "namespace of the ServiceAccount")
	f.StringSliceVar(&a.Namespaces, "namespaces", nil, "only these namespaces, as the --for controller's --namespaces (default: all)")
	f.BoolVar(&a.CreateNamespaces, "create-namespaces", false, "let it create namespaces, as the --for controller's --create-namespaces")
	f.DurationVar(&ttl, "ttl", 30*24*time.Hour, "how long the token is valid (at least 10m); the controller alerts 7 days before it expires")
	f.StringVarP(&out, "output", "o", "-", "file to write the kubeconfig to (mode 0600; - for stdout)")
	f.BoolVar(&revoke, "revoke", false, "delete the access of --for instead")
	return cmd
}

// adminConfig reaches a cluster as its admin, for the commands that grant
// access in it (peer-kubeconfig, hub).
func adminConfig(kubeconfig, kctx string) (*rest.Config, error) {
	cfg, err := kube.RESTConfig(kubeconfig, kctx)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 15 * time.Second
	return cfg, nil
}

// writeOutput writes a kubeconfig to out (- for stdout; a file is 0600:
// it holds a token).
func writeOutput(cmd *cobra.Command, out string, data []byte) error {
	if out == "-" {
		_, err := cmd.OutOrStdout().Write(data)
		return err
	}
	return os.WriteFile(out, data, 0o600)
}
