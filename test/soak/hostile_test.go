//go:build e2e

package soak

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/devenv"
	cmschema "github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// forgedPrefix starts the ids of the records the hostile writer forges:
// they are its, not the fleet's (the stray-instance count skips them; no
// import may ever serve them).
const forgedPrefix = "forged-"

// forgedAddress tells an address the hostile writer forged.
func forgedAddress(ip string) bool {
	return strings.HasPrefix(ip, "127.") || strings.HasPrefix(ip, "169.254.") || strings.HasPrefix(ip, "10.250.")
}

// forge registers, in every exported service, as a writer of the same
// account: an endpoint at a loopback and one at the instance metadata
// address under the exporter's name (the AWS controller's schema), one
// with a port name no Service holds, and a clustermap endpoint record
// under another cluster's name with an id that is not that cluster's.
func (f *fleet) forge(t *testing.T) {
	ctx := context.Background()
	nss, err := f.sd.ListNamespaces(ctx, &sd.ListNamespacesInput{})
	harness.Must(t, err)
	var nsID string
	for _, ns := range nss.Namespaces {
		if aws.ToString(ns.Name) == nsMCS {
			nsID = aws.ToString(ns.Id)
		}
	}
	if nsID == "" {
		t.Fatalf("no Cloud Map namespace %s", nsMCS)
	}
	owner := map[string]int{}
	for _, it := range f.w.snapshot() {
		if it.kind == kindMCS {
			owner[it.name] = it.cluster
		}
	}
	n := 0
	p := sd.NewListServicesPaginator(f.sd, &sd.ListServicesInput{Filters: []sdtypes.ServiceFilter{{Name: sdtypes.ServiceFilterNameNamespaceId, Values: []string{nsID}}}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		harness.Must(t, err)
		for _, s := range page.Services {
			c, ok := owner[aws.ToString(s.Name)]
			if !ok {
				continue
			}
			n++
			exporter, other := f.ids[c], f.ids[(c+1)%len(f.ids)]
			endpoint := func(cluster, ip, portName string) map[string]string {
				return map[string]string{cmschema.AttrIPv4: ip, cmschema.AttrPort: "8080", cmschema.AttrEndpointPortName: portName,
					cmschema.AttrEndpointProtocol: "TCP", cmschema.AttrServicePort: "80", cmschema.AttrServicePortName: portName,
					cmschema.AttrServiceProtocol: "TCP", cmschema.AttrReady: "true", cmschema.AttrServiceType: "ClusterSetIP",
					cmschema.AttrClusterID: cluster, cmschema.AttrClusterSetID: devenv.DefaultClusterSet, cmschema.AttrExportCreationTime: "1577836800001"}
			}
			spoof := endpoint(other, fmt.Sprintf("10.250.%d.%d", n/250, n%250+1), "http")
			spoof[cmschema.AttrController] = "clustermap v0.0.0"
			for id, attrs := range map[string]map[string]string{
				"loopback": endpoint(exporter, "127.0.0.1", "http"),
				"metadata": endpoint(exporter, "169.254.169.254", "http"),
				"badname":  endpoint(exporter, "10.250.255.1", "Not_A_Label!"),
				"spoof":    spoof,
			} {
				_, err := f.sd.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: s.Id, InstanceId: aws.String(forgedPrefix + id + "-" + aws.ToString(s.Name)), Attributes: attrs})
				harness.Must(t, err)
			}
		}
	}
	t.Logf("forged 4 records in each of %d exported services", n)
}
