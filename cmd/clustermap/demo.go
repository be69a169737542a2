package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
)

// runDemo starts two clusters and shows what each knows about itself. The
// Cloud Map emulator, the controllers and an exported sample service join
// it as they are built (issues 3 and 7).
func runDemo(ctx context.Context, cmd *cobra.Command, opts devenv.Options) error {
	opts.Clusters = 2
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
	fmt.Fprintln(w, "\nThe demo runs until interrupted (Ctrl-C), then stops everything.")
	<-ctx.Done()
	return nil
}
