package cloudmapclient_test

import (
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

// Discover* calls have a budget of their own: a control-plane budget spent
// to the last token does not hold them up.
func TestDataPlaneCallsHaveTheirOwnBudget(t *testing.T) {
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	ctx := context.Background()
	// One control-plane call every 100 s; data-plane calls unlimited.
	c, err := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, Region: "us-east-1", QPS: 0.01, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListNamespaces(ctx, &sd.ListNamespacesInput{}); err != nil {
		t.Fatal(err) // spends the only token
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		_, err := c.DiscoverInstancesRevision(dctx, &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("none"), ServiceName: aws.String("none")})
		var missing *types.NamespaceNotFound
		if !errors.As(err, &missing) {
			t.Fatalf("a data-plane call should reach Cloud Map (and find no namespace), got: %v", err)
		}
	}
	// The control-plane budget does hold up the next control-plane call.
	cctx, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if _, err := c.ListNamespaces(cctx, &sd.ListNamespacesInput{}); err == nil {
		t.Error("a second control-plane call went through an empty budget")
	}
}
