//go:build e2e

package cloudmap_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt/recordfmttest"
)

const hostileAccount = "333333333333"

// A member of the clusterset's share writes records under other clusters'
// names: new instances in strict sharing, and over theirs where sharing
// lets any account change any instance. Importers refuse every record
// whose creator (CreatedByAccount) is not the account its cluster is bound
// to, report it, and keep importing the real clusters' records.
func TestHostileMemberIsRefused(t *testing.T) {
	t.Parallel()
	for _, permissive := range []bool{false, true} {
		t.Run(fmt.Sprintf("permissive sharing %v", permissive), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures(), PermissiveSharing: permissive,
				Accounts: map[string]string{"AKIDOWNER": ownerAccount, "AKIDMEMBER": memberAccount, "AKIDHOSTILE": hostileAccount}})
			east := newMember(t, ctx, srv, "AKIDOWNER", ownerAccount, "east")
			west := newMember(t, ctx, srv, "AKIDMEMBER", memberAccount, "west")
			web := registry.Key{Namespace: "apps", Name: "web"}
			if err := publish(ctx, east.b, export("east", web, "10.1.0.1")); err != nil {
				t.Fatal(err)
			}
			shareWithMember(t, srv, east)
			for _, ns := range []string{"apps", cloudmap.ChangesNamespace("set")} {
				if err := srv.Share(namespaceARN(t, east.c, ns), hostileAccount); err != nil {
					t.Fatal(err)
				}
			}
			waitUntil(t, "west's export", func() bool { return publish(ctx, west.b, export("west", web, "10.2.0.1")) == nil })
			waitUntil(t, "east imports west", func() bool { return len(east.clusters(web)) == 2 })

			// The hostile account: a new endpoint record claiming west,
			// one claiming east, and, where sharing allows it, west's
			// own service record rewritten to lead elsewhere.
			co := srv.Shipped()
			co.Credentials = credentials.NewStaticCredentialsProvider("AKIDHOSTILE", "s", "")
			hostile := srv.Client(t, co)
			svcs, err := hostile.ListServices(ctx, &sd.ListServicesInput{Filters: []types.ServiceFilter{
				{Name: types.ServiceFilterNameNamespaceId, Values: []string{namespaceARN(t, east.c, "apps")}}}})
			if err != nil || len(svcs.Services) != 1 {
				t.Fatalf("the hostile member lists %v (%v)", svcs, err)
			}
			svcARN := svcs.Services[0].Arn
			// Each forged record is in place (its operation done) before the
			// exports change.
			var register func(id string, attrs map[string]string) error
			forge := func(id, cluster, ip string) error {
				return register(id, map[string]string{
					recordfmt.AttrIPv4: ip, recordfmt.AttrPort: "8080", recordfmt.AttrEndpointPortName: "http", recordfmt.AttrEndpointProtocol: "TCP",
					recordfmt.AttrServicePort: "80", recordfmt.AttrServicePortName: "http", recordfmt.AttrServiceProtocol: "TCP",
					recordfmt.AttrReady: "true", recordfmt.AttrClusterID: cluster, recordfmt.AttrClusterSetID: "set", recordfmt.AttrServiceType: "ClusterSetIP",
				})
			}
			register = func(id string, attrs map[string]string) error {
				in := &sd.RegisterInstanceInput{ServiceId: svcARN, InstanceId: aws.String(id), Attributes: attrs}
				out, err := hostile.RegisterInstance(ctx, in)
				// The instance's owner may still be writing it (its
				// operation not yet ended); a hostile writer waits its turn.
				var busy *types.DuplicateRequest
				for deadline := time.Now().Add(30 * time.Second); errors.As(err, &busy) && time.Now().Before(deadline); {
					time.Sleep(200 * time.Millisecond)
					out, err = hostile.RegisterInstance(ctx, in)
				}
				if err != nil {
					return err
				}
				// Its operation, on the owner's namespace, is read with
				// the owner's account named.
				for {
					op, err := hostile.GetOperation(ctx, &sd.GetOperationInput{OperationId: out.OperationId, OwnerAccount: aws.String(ownerAccount)})
					if err != nil || op.Operation.Status == types.OperationStatusSuccess {
						return err
					}
					if op.Operation.Status == types.OperationStatusFail {
						return fmt.Errorf("forging %s: %s", id, aws.ToString(op.Operation.ErrorMessage))
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if err := forge("forged-west", "west", "10.9.9.1"); err != nil {
				t.Fatal(err)
			}
			if err := forge("forged-east", "east", "10.9.9.2"); err != nil {
				t.Fatal(err)
			}
			overwrote := false
			recordID := recordfmt.ServiceRecordID("set", "west")
			if err := forge(recordID, "west", "10.9.9.3"); err == nil {
				overwrote = true
			} else if permissive {
				t.Fatalf("permissive sharing refused the overwrite: %v", err)
			}
			// west and east change their exports: both importers read web
			// again, hostile records included.
			if err := publish(ctx, west.b, export("west", web, "10.2.0.2")); err != nil && !overwrote {
				t.Fatal(err)
			}
			if err := publish(ctx, east.b, export("east", web, "10.1.0.2")); err != nil {
				t.Fatal(err)
			}
			for _, m := range []*member{east, west} {
				waitUntil(t, "both importers read the changes", func() bool {
					return slices.Contains(m.ips(web), "10.1.0.2") && (overwrote || slices.Contains(m.ips(web), "10.2.0.2"))
				})
				for _, ip := range []string{"10.9.9.1", "10.9.9.2", "10.9.9.3"} {
					if slices.Contains(m.ips(web), ip) {
						t.Errorf("a forged record was imported: %s in %v", ip, m.ips(web))
					}
				}
				reported := func() []string {
					m.mu.Lock()
					defer m.mu.Unlock()
					var out []string
					for _, f := range m.foreign {
						out = append(out, fmt.Sprintf("%s by %s not %s", f.Cluster, f.CreatedBy, f.Bound))
					}
					return out
				}
				// A read may trail the writes: the change's later reads
				// show the forged records.
				for _, want := range []string{"west by " + hostileAccount + " not " + memberAccount, "east by " + hostileAccount + " not " + ownerAccount} {
					waitUntil(t, fmt.Sprintf("%q reported", want), func() bool { return slices.Contains(reported(), want) })
				}
				// Whose instances fill the service is named by the account
				// that wrote them, not only the cluster they claim.
				waitUntil(t, "the hostile account named among the service's holders", func() bool {
					return strings.Contains(m.usage.Summary(), "(account "+hostileAccount+") 1")
				})
			}
			if permissive {
				return
			}
			// Under a cluster name of its own, two chunks of a few
			// thousand characters: one port named 262,000 times (an
			// importer decoded it to as many endpoints, 383 MiB) and
			// 50,000 endpoints. The first is refused, the second read up
			// to the cap, and both importers go on.
			bomb, wide := recordfmttest.HostileChunks()
			for n, payload := range []string{bomb, wide} {
				if err := register(recordfmt.ChunkID("set", "mallory", n+1), recordfmt.ChunkAttrs("set", "mallory", payload)); err != nil {
					t.Fatal(err)
				}
			}
			if err := publish(ctx, east.b, export("east", web, "10.1.0.3")); err != nil {
				t.Fatal(err)
			}
			for _, m := range []*member{east, west} {
				var got string
				waitUntil(t, "mallory's chunks read: one refused, one cut at the cap", func() bool {
					m.mu.Lock()
					defer m.mu.Unlock()
					for _, e := range m.heard[web] {
						if e.Cluster == "mallory" {
							got = fmt.Sprintf("%d endpoints, capped at %d, %d records refused", len(e.Endpoints), e.Capped, len(e.Invalid))
							return len(e.Endpoints) <= registry.DefaultMaxImportEndpoints && e.Capped == registry.DefaultMaxImportEndpoints && len(e.Invalid) == 1
						}
					}
					return false
				})
				t.Logf("mallory: %s", got)
				waitUntil(t, "the importer goes on", func() bool { return slices.Contains(m.ips(web), "10.1.0.3") })
			}
		})
	}
}

// ips are the ready endpoint addresses this member heard for key.
func (m *member) ips(key registry.Key) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.heard[key] {
		for _, ep := range e.Endpoints {
			out = append(out, ep.IP)
		}
	}
	return out
}
