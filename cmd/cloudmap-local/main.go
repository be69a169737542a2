// Command cloudmap-local is a local AWS Cloud Map (the servicediscovery
// API) for development and tests: part of clustermap's lab, not of the
// product users install.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cloudmap-local:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var (
		listen, admin string
		opts          cloudmaplocal.Options
		outage        bool
		errorRate     float64
		latency       time.Duration
		limits        []string
		credentials   []string
		accounts      []string
		profileName   string
		opTime        string
		readLag       time.Duration
		tenants       float64
		lateFailures  float64
		controlRate   string
	)
	cmd := &cobra.Command{
		Use:   "cloudmap-local",
		Short: "Run a local AWS Cloud Map (the servicediscovery API) for development and tests",
		Long: `Serves the AWS Cloud Map API (AWS JSON 1.1, all operations of the 2017-03-14
model) on --listen; point any AWS SDK or the AWS CLI at it with
--endpoint-url or AWS_ENDPOINT_URL_SERVICEDISCOVERY. Faults, namespace
shares and metrics are served apart, on --admin-listen: GET/PUT /faults,
GET/POST/DELETE /shares, GET /metrics.

Accounts and Regions: each access key belongs to an account (--access-key;
every other key is --account's). A signed request is served in the Region of
its signature's credential scope, each Region with its own namespaces,
ARNs, operations and quotas; unsigned requests go to --region. Request
quotas (--control-rate, the data plane's documented ones, --rate-limit
faults) apply per account and Region.

Behaviour (--profile): aws, the default, is Cloud Map as documented, with a
conservative assumption wherever AWS publishes no figure: operations take
time (--operation-time), data-plane reads trail writes (--read-lag),
ListOperations pages all the account's operations before it filters, other
tenants add operations (--tenant-operations), calls have quotas, and a
share of accepted operations fails (--late-failure-rate). instant answers
at once, for unit tests of logic only. docs/emulator.md has every default
and its source.

Sharing (the AWS RAM step): POST /shares {"namespaceArn": ARN, "accounts":
[ID...]} shares a namespace at once (as inside an Organization with sharing
on); DELETE /shares with the same body stops it. The documented rules hold:
another account's namespace and services are named by ARN; DiscoverInstances,
DiscoverInstancesRevision and GetOperation need OwnerAccount for a shared
namespace (NamespaceNotFound or OperationNotFound without); ResourceOwner and
CreatedByAccount are filled; RESOURCE_OWNER filters SELF and OTHER_ACCOUNTS;
ListOperations never lists other accounts' operations on a shared namespace;
unsharing cuts consumers off and deletes nothing.

Where the AWS docs are silent this emulator takes the strict reading:
  - a consumer may change or remove only what its account created (the
    owner anything): AccessDeniedException otherwise (--permissive-sharing
    takes the loose reading: anyone may, and a re-registered instance
    becomes the registrant's);
  - a consumer's ListOperations omits even its own operations on a shared
    namespace (read them with GetOperation and OwnerAccount);
  - GetOperation answers only the caller's own operations;
  - no tags on a shared namespace or its services, for the owner too while
    the share lasts (InvalidInput); the owner may still read and remove
    tags set before;
  - a namespace is visible to its consumers the moment it is shared.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			profile, err := profileFrom(cmd, profileName, opTime, readLag, tenants, lateFailures, controlRate)
			if err != nil {
				return err
			}
			opts.Profile = &profile
			opts.Faults = cloudmaplocal.Faults{
				Outage: outage, ErrorRate: errorRate, Latency: cloudmaplocal.Duration{Duration: latency},
				RateLimits: map[string]cloudmaplocal.RateLimit{},
			}
			for _, l := range limits {
				op, rl, err := parseRateLimit(l)
				if err != nil {
					return err
				}
				opts.Faults.RateLimits[op] = rl
			}
			if len(credentials) > 0 {
				opts.Credentials = map[string]string{}
				for _, c := range credentials {
					id, secret, ok := strings.Cut(c, ":")
					if !ok {
						return fmt.Errorf("--credentials %q: want ACCESS_KEY_ID:SECRET", c)
					}
					opts.Credentials[id] = secret
				}
			}
			if len(accounts) > 0 {
				opts.Accounts = map[string]string{}
				for _, a := range accounts {
					key, id, ok := strings.Cut(a, "=")
					if !ok || len(id) != 12 || strings.Trim(id, "0123456789") != "" {
						return fmt.Errorf("--access-key %q: want ACCESS_KEY_ID=ACCOUNT_ID (12 digits)", a)
					}
					opts.Accounts[key] = id
				}
			}
			if opts.DataDir != "" {
				if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
					return err
				}
			}
			srv, err := cloudmaplocal.New(opts)
			if err != nil {
				return err
			}
			defer srv.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			apiL, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w (choose another address with --listen)", listen, err)
			}
			adminL, err := net.Listen("tcp", admin)
			if err != nil {
				apiL.Close()
				return fmt.Errorf("--admin-listen %s: %w (choose another address with --admin-listen)", admin, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Cloud Map API on http://%s (admin, faults and metrics on http://%s)\n", apiL.Addr(), adminL.Addr())
			return serve(ctx, map[net.Listener]http.Handler{apiL: srv.Handler(), adminL: srv.AdminHandler()})
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:4566", "address of the Cloud Map API")
	f.StringVar(&admin, "admin-listen", "127.0.0.1:4567", "address of the admin endpoint (faults, metrics)")
	f.StringVar(&opts.DataDir, "data-dir", "", "keep state here across restarts (default: memory only)")
	f.StringVar(&opts.Region, "region", "us-east-1", "Region of unsigned requests (signed ones are served in the Region they are signed for)")
	f.StringVar(&opts.Account, "account", "123456789012", "account of every access key --access-key does not name")
	f.StringSliceVar(&accounts, "access-key", nil, "ACCESS_KEY_ID=ACCOUNT_ID: the account a key belongs to (repeatable)")
	f.BoolVar(&opts.PermissiveSharing, "permissive-sharing", false, "let any account of a shared namespace change or remove what another created in it (the loose reading; default strict)")
	aws := cloudmaplocal.AWS()
	f.StringVar(&profileName, "profile", "aws", "behaviour where Cloud Map's reference is silent: aws (as documented, conservative assumptions; docs/emulator.md) or instant (operations at once, no lag, no quotas on calls: unit tests of logic only); the flags below change one of its parameters")
	f.StringVar(&opTime, "operation-time", aws.OperationTime.String(), "how long asynchronous operations stay SUBMITTED/PENDING: DURATION, or MIN-MAX drawn uniformly")
	f.DurationVar(&readLag, "read-lag", aws.ReadLag, "how far DiscoverInstances and DiscoverInstancesRevision trail completed operations (each read: uniformly up to this)")
	f.Float64Var(&tenants, "tenant-operations", aws.TenantOperations, "operations per second of the account's other tenants (an ECS service), which ListOperations pages through")
	f.Float64Var(&lateFailures, "late-failure-rate", aws.LateFailureRate, "share of asynchronous operations accepted and then ending FAIL")
	f.StringVar(&controlRate, "control-rate", fmt.Sprintf("%g/%d", aws.ControlRate.Rate, aws.ControlRate.Burst), "request quota of each control-plane operation per account and Region, RATE[/BURST] (0: none)")
	f.IntVar(&opts.MaxNamespaces, "max-namespaces", 50, "namespace quota")
	f.IntVar(&opts.MaxInstancesPerNamespace, "max-instances-per-namespace", 2000, "instances-per-namespace quota")
	f.BoolVar(&outage, "outage", false, "start in an outage (every call answers 503)")
	f.Float64Var(&errorRate, "error-rate", 0, "share of calls answered with 500 InternalFailure")
	f.DurationVar(&latency, "latency", 0, "latency added to every call")
	f.StringSliceVar(&limits, "rate-limit", nil, "OPERATION=RATE[/BURST] token bucket as a fault, on top of the profile's quotas (repeatable; * for every operation)")
	f.StringSliceVar(&credentials, "credentials", nil, "ACCESS_KEY_ID:SECRET; when set, SigV4 signatures are checked")
	return cmd
}

// profileFrom is the named profile with the parameters set by flags.
func profileFrom(cmd *cobra.Command, name, opTime string, readLag time.Duration, tenants, lateFailures float64, controlRate string) (cloudmaplocal.Profile, error) {
	p, err := cloudmaplocal.ProfileNamed(name)
	if err != nil {
		return p, fmt.Errorf("--profile: %w", err)
	}
	f := cmd.Flags()
	if f.Changed("operation-time") {
		lo, hi, ranged := strings.Cut(opTime, "-")
		if !ranged {
			hi = lo
		}
		min, err1 := time.ParseDuration(lo)
		max, err2 := time.ParseDuration(hi)
		if err := errors.Join(err1, err2); err != nil || max < min {
			return p, fmt.Errorf("--operation-time %q: want DURATION or MIN-MAX, e.g. 500ms-4s", opTime)
		}
		p.OperationTime = cloudmaplocal.Spread{Min: min, Max: max}
	}
	if f.Changed("read-lag") {
		p.ReadLag = readLag
	}
	if f.Changed("tenant-operations") {
		p.TenantOperations = tenants
	}
	if f.Changed("late-failure-rate") {
		p.LateFailureRate = lateFailures
	}
	if f.Changed("control-rate") {
		_, rl, err := parseRateLimit("control=" + controlRate)
		if err != nil {
			return p, fmt.Errorf("--control-rate %q: want RATE[/BURST], e.g. 50/100", controlRate)
		}
		p.ControlRate = rl
	}
	return p, nil
}

// parseRateLimit reads OPERATION=RATE[/BURST].
func parseRateLimit(s string) (string, cloudmaplocal.RateLimit, error) {
	op, spec, ok := strings.Cut(s, "=")
	var rl cloudmaplocal.RateLimit
	if ok {
		rate, burst, hasBurst := strings.Cut(spec, "/")
		_, err := fmt.Sscanf(rate, "%g", &rl.Rate)
		if err == nil && hasBurst {
			_, err = fmt.Sscanf(burst, "%d", &rl.Burst)
		}
		if err == nil {
			if !hasBurst {
				rl.Burst = max(int(rl.Rate), 1)
			}
			return op, rl, nil
		}
	}
	return "", rl, fmt.Errorf("--rate-limit %q: want OPERATION=RATE[/BURST], e.g. DiscoverInstances=1000/2000", s)
}

// serve runs HTTP servers until ctx ends, then shuts them down.
func serve(ctx context.Context, handlers map[net.Listener]http.Handler) error {
	errc := make(chan error, len(handlers))
	var servers []*http.Server
	for l, h := range handlers {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() { errc <- srv.Serve(l) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(shutdown)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
