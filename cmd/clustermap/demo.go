package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/devenv"
)

// runDemo starts two clusters and the Cloud Map emulator and shows what
// each cluster knows about itself. The controllers and an exported sample
// service join it as they are built (issue 3).
func runDemo(ctx context.Context, cmd *cobra.Command, opts devenv.Options, cloudMapAddr string) error {
	opts.Clusters = 2
	cm, err := devenv.StartCloudMap(cloudmaplocal.Options{}, cloudMapAddr, "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("%w (choose another address with --cloudmap-listen)", err)
	}
	defer cm.Close()
	env, err := devenv.Up(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(cmd.ErrOrStderr(), "demo: stopping")
		if err := env.Down(context.Background()); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "demo: stopping failed, run `clustermap dev down`:", err)
		}
	}()
	w := cmd.OutOrStdout()
	for _, c := range env.Clusters {
		cl, err := client.New(c.Config, client.Options{Scheme: devenv.Scheme})
		if err != nil {
			return err
		}
		props := &aboutv1alpha1.ClusterPropertyList{}
		if err := cl.List(ctx, props); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s (%s):\n", c.ID, c.Server)
		for _, p := range props.Items {
			fmt.Fprintf(w, "  ClusterProperty %-26s %s\n", p.Name, p.Spec.Value)
		}
	}
	printUsage(cmd, env)
	fmt.Fprintf(w, "\nCloud Map emulator: %s (faults and metrics: %s/faults, %s/metrics)\n", cm.URL, cm.AdminURL, cm.AdminURL)
	fmt.Fprintf(w, "  AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local aws --region us-east-1 --endpoint-url %s servicediscovery list-namespaces\n", cm.URL)
	fmt.Fprintln(w, "\nThe demo runs until interrupted (Ctrl-C), then stops everything.")
	<-ctx.Done()
	return nil
}
