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
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/aws/smithy-go"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// Discover* calls have a budget of their own: a control-plane budget spent
// to the last token does not hold them up.
func TestDataPlaneCallsHaveTheirOwnBudget(t *testing.T) {
	api := cloudmaptest.Start(t, cloudmaplocal.Options{})
	ctx := context.Background()
	// One control-plane call every 100 s; data-plane calls unlimited.
	c := api.Client(t, cloudmapclient.Options{QPS: 0.01, Burst: 1})
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

// noRegionConfig clears every source of a region but instance metadata,
// which it points at imdsURL (a stand-in for the EC2 metadata service).
func noRegionConfig(t *testing.T, imdsURL string) {
	for _, v := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_EC2_METADATA_DISABLED"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imdsURL)
}

// No region anywhere, instance metadata included, is an error naming every
// source tried, never a guess.
func TestNoRegionIsAnError(t *testing.T) {
	noRegionConfig(t, "http://127.0.0.1:1") // nothing listens there
	_, err := cloudmapclient.New(context.Background(), cloudmapclient.Options{Endpoint: "http://127.0.0.1:1"})
	if !errors.Is(err, cloudmapclient.ErrNoRegion) {
		t.Fatalf("want ErrNoRegion, got %v", err)
	}
	for _, name := range []string{"--region", "AWS_REGION", "AWS_DEFAULT_REGION", "shared config", "instance metadata"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error should name %s: %v", name, err)
		}
	}
}

// With nothing else set, the region comes from EC2 instance metadata
// (IMDSv2: a session token, then the instance identity document), as seed
// 000 infers it.
func TestRegionFromInstanceMetadata(t *testing.T) {
	const token = "imds-token"
	var tokens int
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			tokens++
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			_, _ = w.Write([]byte(token))
		case r.URL.Path == "/latest/dynamic/instance-identity/document" && r.Header.Get("X-Aws-Ec2-Metadata-Token") == token:
			_, _ = w.Write([]byte(`{"accountId": "210987654321", "region": "eu-central-2", "instanceId": "i-0abc"}`))
		default:
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		}
	}))
	defer imds.Close()
	noRegionConfig(t, imds.URL)
	c, err := cloudmapclient.New(context.Background(), cloudmapclient.Options{Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Options().Region; got != "eu-central-2" || tokens == 0 {
		t.Errorf("region %q after %d token requests; want eu-central-2 through IMDSv2", got, tokens)
	}

	// An explicit region wins; metadata is not asked.
	tokens = 0
	t.Setenv("AWS_REGION", "ap-south-1")
	c, err = cloudmapclient.New(context.Background(), cloudmapclient.Options{Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Options().Region; got != "ap-south-1" || tokens != 0 {
		t.Errorf("region %q, %d metadata token requests; want ap-south-1 from AWS_REGION and none", got, tokens)
	}
}

// A custom endpoint (a VPC endpoint URL, say) keeps the default credential
// chain: with no credentials in the environment, the instance role (from a
// stand-in instance metadata service) signs, and the emulator, told to
// accept only that role's key, takes the calls.
func TestCustomEndpointKeepsTheCredentialChain(t *testing.T) {
	api := cloudmaptest.Start(t, cloudmaplocal.Options{Credentials: map[string]string{"AKIDINSTANCEROLE": "role-secret"}})
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

// The account the credentials belong to comes from STS GetCallerIdentity,
// asked at the custom endpoint like Cloud Map, signed (the emulator checks).
func TestCallerAccount(t *testing.T) {
	api := cloudmaptest.Start(t, cloudmaplocal.Options{
		Credentials: map[string]string{"AKIDMEMBER": "s"}, Accounts: map[string]string{"AKIDMEMBER": "222222222222"},
	})
	account, err := cloudmapclient.CallerAccount(context.Background(), cloudmapclient.Options{
		Endpoint: api.URL, Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDMEMBER", "s", ""),
	})
	if err != nil || account != "222222222222" {
		t.Fatalf("CallerAccount = %q, %v; want 222222222222", account, err)
	}
	_, err = cloudmapclient.CallerAccount(context.Background(), cloudmapclient.Options{
		Endpoint: api.URL, Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDMEMBER", "wrong", ""),
	})
	if err == nil {
		t.Fatal("a bad signature got an account")
	}
}

func TestErrorKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, cloudmapclient.KindOK},
		{&smithy.GenericAPIError{Code: "RequestLimitExceeded"}, cloudmapclient.KindThrottled},
		{&smithy.GenericAPIError{Code: "ThrottlingException"}, cloudmapclient.KindThrottled},
		{fmt.Errorf("registering: %w", &smithy.GenericAPIError{Code: "AccessDeniedException"}), cloudmapclient.KindAccessDenied},
		{&types.NamespaceNotFound{}, cloudmapclient.KindNotFound},
		{&types.ServiceNotFound{}, cloudmapclient.KindNotFound},
		{&smithy.GenericAPIError{Code: "InvalidInput"}, cloudmapclient.KindOther},
		{errors.New("connection refused"), cloudmapclient.KindOther},
	} {
		if got := cloudmapclient.ErrorKind(c.err); got != c.want {
			t.Errorf("ErrorKind(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}
