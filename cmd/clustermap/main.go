// Command clustermap is multi-cluster service discovery for Kubernetes:
// what runs in or against a cluster (the controller, the DNS server,
// status, uninstall). The dev environment and the Cloud Map emulator are
// binaries of their own (clustermap-dev, cloudmap-local).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	// The image has no CA bundle: the binary carries Mozilla's roots, used
	// only where the system has none.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/clustermap/clustermap/internal/version"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "clustermap:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "clustermap",
		Short:         "Multi-cluster service discovery for Kubernetes over AWS Cloud Map or a hub cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version.String()) },
		},
		newController(),
		newDNS(),
		newStatus(),
		newUninstall(),
		newForgetCluster(),
		newPeerKubeconfig(),
		newHub(),
		newVerify(),
		newProbe(),
	)
	return root
}
