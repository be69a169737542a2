package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmdns "github.com/clustermap/clustermap/internal/dns"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/version"
)

func newDNS() *cobra.Command {
	var (
		listen, zone, kubeconfig, kubeContext, health, metricsAddr string
		ttl                                                        uint32
		metricsSecure                                              bool
	)
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Serve the clusterset.local zone from this cluster's ServiceImports",
		Long: `Answers <svc>.<ns>.svc.<zone> (A, AAAA, SRV), per-endpoint names of headless
imports, PTR for the addresses it serves, TXT dns-version, SOA and NS, over
UDP and TCP. Forward the zone to it from the cluster's CoreDNS (see
config/dns/Corefile.snippet). Health (/healthz), readiness (/readyz, once
its informers synced) and metrics (/metrics) are on --health-address, or
metrics on --metrics-bind-address, with --metrics-secure over HTTPS to
callers the API server authenticates and authorizes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zap.New()
			ctrl.SetLogger(log)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cfg, err := kube.RESTConfig(kubeconfig, kubeContext)
			if err != nil {
				return fmt.Errorf("reaching the cluster: %w (pass --kubeconfig and --context, or run in a cluster)", err)
			}
			// controller-runtime's registry: its metrics server (below) serves it.
			reg := ctrlmetrics.Registry
			kube.Register(reg, version.BuildInfo("dns"))
			srv, err := cmdns.Start(ctx, cfg, listen, zone, ttl, reg)
			if err != nil {
				return fmt.Errorf("%w (choose another address with --listen)", err)
			}
			defer srv.Close()
			healthErr, metricsErr := make(chan error, 1), make(chan error, 1)
			if health != "0" {
				mux := http.NewServeMux()
				mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
					if err := srv.Healthy(); err != nil {
						http.Error(w, err.Error(), http.StatusServiceUnavailable)
						return
					}
					_, _ = w.Write([]byte("ok\n"))
				})
				mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
					select {
					case <-srv.Synced():
						_, _ = w.Write([]byte("ok\n"))
					default:
						http.Error(w, "informers not synced yet", http.StatusServiceUnavailable)
					}
				})
				if metricsAddr == "" {
					mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				}
				hs := &http.Server{Addr: health, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
				go func() { healthErr <- hs.ListenAndServe() }()
				defer hs.Close()
			}
			if metricsAddr != "" {
				hc, err := rest.HTTPClientFor(cfg)
				if err != nil {
					return err
				}
				ms, err := metricsserver.NewServer(kube.MetricsServing(metricsAddr, metricsSecure), cfg, hc)
				if err != nil {
					return fmt.Errorf("--metrics-bind-address %s: %w", metricsAddr, err)
				}
				go func() { metricsErr <- ms.Start(ctx) }()
			}
			log.Info("serving DNS", "zone", zone, "listen", srv.Addr)
			select {
			case <-ctx.Done():
				return nil
			case err := <-srv.Err():
				log.Error(err, "the DNS server stopped")
				return err
			case err := <-healthErr:
				return fmt.Errorf("--health-address %s: %w", health, err)
			case err := <-metricsErr:
				if err == nil { // it ends with ctx
					return nil
				}
				return fmt.Errorf("--metrics-bind-address %s: %w", metricsAddr, err)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:5353", "address to serve DNS on, UDP and TCP")
	f.StringVar(&zone, "zone", "clusterset.local", "the zone served")
	f.Uint32Var(&ttl, "ttl", 5, "TTL of the answers, in seconds")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&kubeContext, "context", "", "kubeconfig context")
	f.StringVar(&health, "health-address", ":8081", "address of /healthz, /readyz and (without --metrics-bind-address) /metrics (0 turns them off)")
	f.StringVar(&metricsAddr, "metrics-bind-address", "", "serve /metrics here instead of on --health-address")
	f.BoolVar(&metricsSecure, "metrics-secure", false, "serve /metrics (on --metrics-bind-address) over HTTPS, only to callers the API server authenticates and allows get on the non-resource URL /metrics")
	return cmd
}
