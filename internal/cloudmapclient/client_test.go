package cloudmapclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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
	c, err := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, Region: "us-east-1", Credentials: cloudmapclient.LocalCredentials, QPS: 0.01, Burst: 1})
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

// No region is an error naming the flag and the variable, never a guess.
func TestNoRegionIsAnError(t *testing.T) {
	for _, v := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	_, err := cloudmapclient.New(context.Background(), cloudmapclient.Options{Endpoint: "http://127.0.0.1:1"})
	if !errors.Is(err, cloudmapclient.ErrNoRegion) {
		t.Fatalf("want ErrNoRegion, got %v", err)
	}
	for _, name := range []string{"--region", "AWS_REGION"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error should name %s: %v", name, err)
		}
	}
}

// A custom endpoint (a VPC endpoint URL, say) keeps the default credential
// chain: with no credentials in the environment, the instance role (from a
// stand-in instance metadata service) signs, and the emulator, told to
// accept only that role's key, takes the calls.
func TestCustomEndpointKeepsTheCredentialChain(t *testing.T) {
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{Credentials: map[string]string{"AKIDINSTANCEROLE": "role-secret"}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/latest/api/token":
			fmt.Fprint(w, "token")
		case "/latest/meta-data/iam/security-credentials/":
			fmt.Fprint(w, "node-role")
		case "/latest/meta-data/iam/security-credentials/node-role":
			fmt.Fprintf(w, `{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"AKIDINSTANCEROLE","SecretAccessKey":"role-secret","Token":"t","Expiration":%q}`,
				time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		default:
			http.NotFound(w, r)
		}
	}))
	defer imds.Close()
	for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)
	t.Setenv("AWS_REGION", "eu-west-1")
	ctx := context.Background()
	c, err := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListNamespaces(ctx, &sd.ListNamespacesInput{}); err != nil {
		t.Errorf("signed with the instance role's credentials through a custom endpoint: %v", err)
	}
}
