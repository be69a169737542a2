// Package cloudmapclient builds the aws-sdk-go-v2 Cloud Map client every
// part of clustermap uses: credentials and region the standard SDK way,
// the SDK's standard retryer, a client-side rate limit, and, for a custom
// endpoint such as the local emulator, the data- host prefix turned off.
package cloudmapclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Options for New. Zero values mean the SDK's defaults.
type Options struct {
	// Endpoint overrides the Cloud Map endpoint (AWS_ENDPOINT_URL_SERVICEDISCOVERY
	// and AWS_ENDPOINT_URL are honoured too, as the SDK does).
	Endpoint string
	Region   string
	// QPS and Burst bound this client's control-plane calls (every call
	// but DiscoverInstances and DiscoverInstancesRevision); 0 means
	// unlimited.
	QPS   float64
	Burst int
	// DataQPS and DataBurst bound the data-plane calls, Discover*, which
	// AWS limits apart (1,000 and 3,000 per second per account): they are
	// never starved by control-plane work. 0 means unlimited.
	DataQPS   float64
	DataBurst int
	// MaxAttempts of the standard retryer (default DefaultMaxAttempts).
	MaxAttempts int
	// OnCall, when set, hears of every HTTP attempt: the operation and its
	// error (nil on success).
	OnCall func(operation string, err error)
	// OnLimitWait, when set, hears how long each call waited on this
	// client's rate limiter, by plane ("control" or "data").
	OnLimitWait func(plane string, waited time.Duration)
	// Credentials, when set, replace the default credential chain: tests
	// and the local emulator use LocalCredentials.
	Credentials aws.CredentialsProvider
	// CallTimeout bounds each HTTP attempt (default DefaultCallTimeout).
	CallTimeout time.Duration
}

// Shipped call budgets, per controller. Control-plane limits are
// unpublished: 20 calls/s is the conservative default. Data-plane
// (Discover*) limits are 1,000 and 3,000 calls/s per account: 200/s leaves
// room for five clusters at full speed.
const (
	DefaultQPS       = 20
	DefaultBurst     = 40
	DefaultDataQPS   = 200
	DefaultDataBurst = 400
)

// DefaultMaxAttempts is how often a call is tried (the SDK's default),
// DefaultMaxBackoff the longest wait between two tries (exponential, with
// jitter): a failing call gives up within about 3 s, and its caller's
// own retry (the export's requeue, the watcher's backoff) comes later.
const (
	DefaultMaxAttempts = 3
	DefaultMaxBackoff  = 2 * time.Second
)

// DefaultCallTimeout bounds one attempt of a Cloud Map call: they answer in
// well under a second, and a hung connection must not stall the change
// feed or an export for good (the standard retryer tries again).
const DefaultCallTimeout = 10 * time.Second

// LocalCredentials sign calls to the local emulator, which needs no account.
var LocalCredentials = credentials.NewStaticCredentialsProvider("local", "local", "")

// ErrNoRegion says how to name the region: Cloud Map is regional, and
// guessing one would register into a namespace nobody reads.
var ErrNoRegion = errors.New("no AWS region: tried --region, AWS_REGION, AWS_DEFAULT_REGION, the shared config file (AWS_CONFIG_FILE, AWS_PROFILE) and EC2 instance metadata; pass --region or set AWS_REGION")

// imdsTimeout bounds the instance-metadata lookup of the region, the last
// resort: off EC2 (or with an IMDS hop limit of 1 in a pod) nothing answers.
const imdsTimeout = 5 * time.Second

// New builds a client from the standard credential chain (environment,
// shared config, IRSA web identity, EKS pod identity, instance roles),
// custom endpoints included: a VPC endpoint URL still signs with the
// instance's role.
func New(ctx context.Context, o Options) (*sd.Client, error) {
	cfg, err := load(ctx, o)
	if err != nil {
		return nil, err
	}
	return NewFromConfig(cfg, o), nil
}

// CallerAccount asks STS which account the credentials belong to
// (GetCallerIdentity needs no permission). With Options.Endpoint (the
// emulator) STS is asked there too; AWS_ENDPOINT_URL_STS is honoured.
func CallerAccount(ctx context.Context, o Options) (string, error) {
	cfg, err := load(ctx, o)
	if err != nil {
		return "", err
	}
	out, err := sts.NewFromConfig(cfg, func(so *sts.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
	}).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", fmt.Errorf("asking STS for the account: %w", err)
	}
	return aws.ToString(out.Account), nil
}

// load reads the AWS configuration; a Region unset in the environment and
// the shared config comes from EC2 instance metadata.
func load(ctx context.Context, o Options) (aws.Config, error) {
	var loadOpts []func(*config.LoadOptions) error
	if o.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(o.Region))
	}
	if o.Credentials != nil {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(o.Credentials))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		region, err := imdsRegion(ctx, cfg)
		if err != nil {
			return aws.Config{}, fmt.Errorf("%w (EC2 instance metadata: %v)", ErrNoRegion, err)
		}
		cfg.Region = region
	}
	return cfg, nil
}

// imdsRegion asks EC2 instance metadata for the Region (the SDK's IMDS
// client: AWS_EC2_METADATA_DISABLED and AWS_EC2_METADATA_SERVICE_ENDPOINT
// apply).
func imdsRegion(ctx context.Context, cfg aws.Config) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, imdsTimeout)
	defer cancel()
	out, err := imds.NewFromConfig(cfg).GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil {
		return "", err
	}
	return out.Region, nil
}

// NewFromConfig builds a client from a loaded aws.Config.
func NewFromConfig(cfg aws.Config, o Options) *sd.Client {
	return sd.NewFromConfig(cfg, func(so *sd.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		timeout := o.CallTimeout
		if timeout <= 0 {
			timeout = DefaultCallTimeout
		}
		if bc, ok := so.HTTPClient.(*awshttp.BuildableClient); ok {
			so.HTTPClient = bc.WithTimeout(timeout)
		} else if so.HTTPClient == nil {
			so.HTTPClient = awshttp.NewBuildableClient().WithTimeout(timeout)
		}
		so.Retryer = retry.NewStandard(func(ro *retry.StandardOptions) {
			ro.MaxAttempts = DefaultMaxAttempts
			if o.MaxAttempts > 0 {
				ro.MaxAttempts = o.MaxAttempts
			}
			// The account's quota is shared by every cluster (and tool) in
			// it: throttling is expected in a bulk export, and the budgets
			// above already pace this client. The SDK's retry quota would
			// turn a throttled burst into failures after ~100 retries.
			ro.RateLimiter = ratelimit.None
			// Short waits: a caller that reads services in turn (the change
			// feed) must not stall on one that keeps failing; its own
			// backoff spaces the next try.
			ro.MaxBackoff = DefaultMaxBackoff
		})
		if so.BaseEndpoint != nil {
			// DiscoverInstances* would go to data-<host>, which does not
			// resolve for a custom endpoint (aws-sdk-go-v2 issue 2556).
			so.APIOptions = append(so.APIOptions, disableHostPrefix)
		}
		if o.OnCall != nil {
			so.APIOptions = append(so.APIOptions, func(st *middleware.Stack) error {
				// Deserialize runs once per attempt, retries included.
				return st.Deserialize.Add(middleware.DeserializeMiddlewareFunc("CountCalls",
					func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
						out, md, err := next.HandleDeserialize(ctx, in)
						o.OnCall(awsmiddleware.GetOperationName(ctx), err)
						return out, md, err
					}), middleware.Before)
			})
		}
		control, data := limiter(o.QPS, o.Burst), limiter(o.DataQPS, o.DataBurst)
		so.APIOptions = append(so.APIOptions, func(st *middleware.Stack) error {
			// The stack's id is the operation's name.
			lim, plane := control, "control"
			if st.ID() == "DiscoverInstances" || st.ID() == "DiscoverInstancesRevision" {
				lim, plane = data, "data"
			}
			if lim == nil {
				return nil
			}
			return st.Initialize.Add(middleware.InitializeMiddlewareFunc("ClientRateLimit",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					start := time.Now()
					if err := lim.Wait(ctx); err != nil {
						return middleware.InitializeOutput{}, middleware.Metadata{}, err
					}
					if o.OnLimitWait != nil {
						o.OnLimitWait(plane, time.Since(start))
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		})
	})
}

func limiter(qps float64, burst int) *rate.Limiter {
	if qps <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(qps), max(burst, 1))
}

func disableHostPrefix(st *middleware.Stack) error {
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("DisableEndpointHostPrefix",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			return next.HandleInitialize(smithyhttp.DisableEndpointHostPrefix(ctx, true), in)
		}), middleware.After)
}

// OperationRun is how long an operation is taken to possibly still run
// after the call that started it: AWS publishes no bound; they take
// seconds (the emulator's aws profile: 0.5 to 4 s), and 10 s leaves room.
// Listings show only finished operations, so what may still run is
// waited out before a listing is taken as whole.
const OperationRun = 10 * time.Second

// OperationTimeout bounds WaitOperation: Cloud Map finishes operations in
// seconds, so one still running after this is reported, not waited on.
const OperationTimeout = 2 * time.Minute

// WaitOperation polls an asynchronous operation (namespace, service or
// instance changes) until it succeeds or fails, backing off from 20 ms to 2 s,
// for at most OperationTimeout.
func WaitOperation(ctx context.Context, c *sd.Client, id *string) (*types.Operation, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, OperationTimeout, fmt.Errorf("operation %s did not finish within %v", aws.ToString(id), OperationTimeout))
	defer cancel()
	var op *types.Operation
	err := operationBackoff.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		out, err := c.GetOperation(ctx, &sd.GetOperationInput{OperationId: id})
		if err != nil {
			return false, err
		}
		switch out.Operation.Status {
		case types.OperationStatusSuccess:
			op = out.Operation
			return true, nil
		case types.OperationStatusFail:
			return false, fmt.Errorf("operation %s failed: %s %s", aws.ToString(id), aws.ToString(out.Operation.ErrorCode), aws.ToString(out.Operation.ErrorMessage))
		}
		return false, nil
	})
	if ctx.Err() != nil && op == nil {
		return nil, context.Cause(ctx)
	}
	return op, err
}

// operationBackoff: 20 ms doubling to 2 s, then every 2 s until the
// context's timeout (a DelayFunc keeps the cap once reached, where
// ExponentialBackoff would stop).
var operationBackoff = wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Cap: 2 * time.Second, Steps: math.MaxInt32}

// Calls counts calls by operation; its Record is an Options.OnCall.
type Calls struct {
	mu sync.Mutex
	n  map[string]float64
}

// Record counts one call.
func (c *Calls) Record(op string, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]float64{}
	}
	c.n[op]++
}

// Snapshot returns the counts so far by operation.
func (c *Calls) Snapshot() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}
