package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/clusterstatus"
	"github.com/clustermap/clustermap/internal/kube"
)

func newStatus() *cobra.Command {
	var output, statusNS string
	var reportOnly bool
	var clusters clusterFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the clusterset as each cluster sees it: exports, imports, controller health, anything stuck",
		Long: `Reads each cluster (one per --context; --all-contexts for every context
of the kubeconfig; the current context by default): its identity, every
ServiceExport with its Valid/Ready/Conflict conditions, every ServiceImport
with its exporting clusters and ready endpoints per address family, the
controller's last registry sync (Cloud Map, or the hub) and errors (from its status Lease), and
anything stuck (a finalizer pending, DomainConflict, an unreachable peer or
registry), and every export and import whose conditions say it fails
(Valid or Ready False, RemovalHeld, EndpointsCapped). Exits non-zero when a
cluster cannot be read, or something is stuck or failing, unless
--report-only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			contexts, err := clusters.pick()
			if err != nil {
				return err
			}
			var report []clusterstatus.Cluster
			problems := 0
			for _, kctx := range contexts {
				c := readCluster(cmd.Context(), clusters.kubeconfig, kctx, statusNS)
				if c.Error != "" || len(c.Stuck) > 0 || len(c.Failing) > 0 {
					problems++
				}
				report = append(report, c)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				err = clusterstatus.JSON(out, report)
			} else {
				err = clusterstatus.Table(out, report)
			}
			if err != nil {
				return err
			}
			if problems > 0 && !reportOnly {
				return fmt.Errorf("%d of %d clusters unreachable, or with something stuck or failing", problems, len(report))
			}
			return nil
		},
	}
	f := cmd.Flags()
	clusters.add(f, "kubeconfig contexts, one per cluster (repeat or comma-separate)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.StringVar(&statusNS, "status-namespace", kube.DefaultStatusNamespace, "the controller's namespace (its status Lease)")
	f.BoolVar(&reportOnly, "report-only", false, "exit 0 whatever the report says (only a failure to run is an error)")
	return cmd
}

func readCluster(ctx context.Context, kubeconfig, kctx, statusNS string) clusterstatus.Cluster {
	name := contextName(kctx)
	fail := func(err error) clusterstatus.Cluster {
		return clusterstatus.Cluster{Context: name, Error: err.Error(), Exports: []clusterstatus.Export{}, Imports: []clusterstatus.Import{}, Stuck: []string{}}
	}
	cl, err := clusterClient(kubeconfig, kctx)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := clusterstatus.Gather(ctx, cl, name, statusNS)
	if err != nil {
		return fail(err)
	}
	return clusterstatus.Summarize(r, time.Now())
}

// clusterFlags pick the clusters a command works on: --all-contexts,
// else --context, else the current context ("").
type clusterFlags struct {
	kubeconfig string
	contexts   []string
	all        bool
}

func (c *clusterFlags) add(f *pflag.FlagSet, contextHelp string) {
	f.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	f.StringSliceVar(&c.contexts, "context", nil, contextHelp)
	f.BoolVar(&c.all, "all-contexts", false, "every context of the kubeconfig")
}

func (c *clusterFlags) pick() ([]string, error) {
	if c.all {
		return allContexts(c.kubeconfig)
	}
	if len(c.contexts) == 0 {
		return []string{""}, nil
	}
	return c.contexts, nil
}

func contextName(kctx string) string {
	if kctx == "" {
		return "(current context)"
	}
	return kctx
}

// clusterClient reaches one cluster, with a timeout on every request: a
// cluster that does not answer is reported, not waited on.
func clusterClient(kubeconfig, kctx string) (client.Client, error) {
	cfg, err := kube.RESTConfig(kubeconfig, kctx)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 15 * time.Second
	return client.New(cfg, client.Options{Scheme: kube.Scheme()})
}

func allContexts(kubeconfig string) ([]string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := rules.Load()
	if err != nil {
		return nil, err
	}
	var names []string
	for n := range cfg.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("no contexts in the kubeconfig")
	}
	return names, nil
}
