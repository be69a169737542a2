// Command clustermap is multi-cluster service discovery for Kubernetes.
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
		Short:         "Multi-cluster service discovery for Kubernetes over AWS Cloud Map",
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
		newDev(),
		newCloudMapLocal(),
		newController(),
		newDNS(),
		newStatus(),
		newUninstall(),
	)
	return root
}
