// Package cloudmaptest is the one in-process Cloud Map fixture of the
// tests: the emulator on a loopback port, behaving as Cloud Map does (the
// aws profile: asynchronous operations, lagging reads, a busy account,
// quotas, late failures) unless a test's options say otherwise, and real
// SDK clients over HTTP to it.
package cloudmaptest

import (
	"cmp"
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
)

// Region is the fixture's default Region.
const Region = "us-east-1"

// Emulator is a running emulator; it stops when the test ends.
type Emulator struct {
	*cloudmaplocal.Server
	// URL is its API endpoint.
	URL string
}

// Start serves an emulator with o (the zero Options: one account, Cloud Map
// as documented) until the test ends.
func Start(t testing.TB, o cloudmaplocal.Options) *Emulator {
	t.Helper()
	srv, err := cloudmaplocal.New(o)
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { api.Close(); srv.Close() })
	return &Emulator{Server: srv, URL: api.URL}
}

// Shipped is the client options of a controller at its shipped call
// budgets, against this emulator: what a test of a promise runs at.
func (e *Emulator) Shipped() cloudmapclient.Options {
	return cloudmapclient.Options{Endpoint: e.URL, Region: Region, Credentials: cloudmapclient.LocalCredentials,
		QPS: cloudmapclient.DefaultQPS, Burst: cloudmapclient.DefaultBurst,
		DataQPS: cloudmapclient.DefaultDataQPS, DataBurst: cloudmapclient.DefaultDataBurst}
}

// Client is an SDK client of this emulator made with o (ClientOf).
func (e *Emulator) Client(t testing.TB, o cloudmapclient.Options) *sd.Client {
	t.Helper()
	return ClientOf(t, cmp.Or(o.Endpoint, e.URL), o)
}

// ClientOf is an SDK client of the emulator at url, made with o; an empty
// Region or Credentials is the emulator's. Zero budgets mean unlimited: a
// client that only arranges a test need not wait on them.
func ClientOf(t testing.TB, url string, o cloudmapclient.Options) *sd.Client {
	t.Helper()
	o.Endpoint = url
	o.Region = cmp.Or(o.Region, Region)
	if o.Credentials == nil {
		o.Credentials = cloudmapclient.LocalCredentials
	}
	c, err := cloudmapclient.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Namespace creates an HTTP namespace with c and returns its id.
func Namespace(t testing.TB, c *sd.Client, name string) string {
	t.Helper()
	return Written(t, c, func(ctx context.Context) (*string, error) {
		out, err := c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String(name)})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})["NAMESPACE"]
}

// DNSNamespace creates a private DNS namespace of vpc with c and returns
// its id.
func DNSNamespace(t testing.TB, c *sd.Client, name, vpc string) string {
	t.Helper()
	return Written(t, c, func(ctx context.Context) (*string, error) {
		out, err := c.CreatePrivateDnsNamespace(ctx, &sd.CreatePrivateDnsNamespaceInput{Name: aws.String(name), Vpc: aws.String(vpc)})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})["NAMESPACE"]
}

// Written makes an asynchronous write to Cloud Map (write returns its
// operation id) and waits for it to succeed, making it again when Cloud Map
// refuses it as a duplicate of one still running or fails it late, as the
// aws profile does 1 time in 200 and as a careful script against Cloud Map
// must allow for. It returns the operation's targets.
func Written(t testing.TB, c *sd.Client, write func(ctx context.Context) (*string, error)) map[string]string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		id, err := write(ctx)
		var busy *types.DuplicateRequest
		if err != nil && !errors.As(err, &busy) {
			cancel()
			t.Fatal(err)
		}
		if err == nil {
			var op *types.Operation
			if op, err = cloudmapclient.WaitOperation(ctx, c, id); err == nil {
				cancel()
				return op.Targets
			}
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("no Cloud Map operation succeeded within a minute: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Instant is the options of an emulator that answers at once (operations
// complete before their call returns, reads never lag, no other tenant, no
// quota on calls, nothing fails late): for unit tests of logic only, never
// for a test of what clustermap promises.
func Instant() cloudmaplocal.Options {
	p := cloudmaplocal.Instant()
	return cloudmaplocal.Options{Profile: &p}
}

// FixedOperations is the aws profile with every operation taking d and
// none failing late unless a test's fault says so: a test then knows when
// the operations it starts end.
func FixedOperations(d time.Duration) *cloudmaplocal.Profile {
	p := cloudmaplocal.AWS()
	p.OperationTime = cloudmaplocal.Spread{Min: d, Max: d}
	p.LateFailureRate = 0
	return &p
}
