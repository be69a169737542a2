//go:build e2e

package soak

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	cmschema "github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// forgedPrefix starts the ids of the records the hostile writer forges:
// they are its, not the fleet's (the stray-instance count skips them; no
// import may ever serve them).
const forgedPrefix = "forged-"

// forgedCluster is the cluster name the hostile writer's chunks claim (no
// cluster has it); their ids must be its chunks', so they carry no prefix.
const forgedCluster = "mallory"

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
	f.forgeRecordKinds(t, nss.Namespaces)
}

// forgeRecordKinds forges what packed records and liveness added: in
// every exported service a chunk of a cluster name no cluster has, whose
// 400 characters name one port 262,000 times (it decoded to as many
// endpoints in every importer, and listed its name among the exporters);
// and a liveness record under an id not its cluster's, claiming each
// fleet cluster with a time an hour old (it drained them). Neither may
// change any import.
func (f *fleet) forgeRecordKinds(t *testing.T, nss []sdtypes.NamespaceSummary) {
	ctx := context.Background()
	ids := map[string]string{}
	for _, ns := range nss {
		ids[aws.ToString(ns.Name)] = aws.ToString(ns.Id)
	}
	bomb := []byte{1, 2, 4, 'h', 't', 't', 'p', 3, 'T', 'C', 'P', 1, 0, 1, 2, 1, 2, 0, 0x90, 0x3f, 0x50, 1, 3, 10, 250, 0, 1, 0, 0, 0}
	bomb = binary.AppendUvarint(bomb, 262_000)
	bomb = append(bomb, make([]byte, 262_000)...)
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.BestCompression)
	_, _ = w.Write(bomb)
	_ = w.Close()
	payload := base64.StdEncoding.EncodeToString(z.Bytes())
	n := 0
	for svc := range f.services(t, ids[nsMCS]) {
		_, err := f.sd.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String(cmschema.ChunkID(devenv.DefaultClusterSet, forgedCluster, 1)),
			Attributes: map[string]string{cmschema.AttrClusterID: forgedCluster, cmschema.AttrClusterSetID: devenv.DefaultClusterSet,
				cmschema.AttrRecord: "endpoints", cmschema.AttrPackedParts + "0": payload}})
		harness.Must(t, err)
		n++
	}
	old := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	for changes := range f.services(t, ids[cloudmap.ChangesNamespace(devenv.DefaultClusterSet)]) {
		for _, id := range f.ids {
			_, err := f.sd.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(changes), InstanceId: aws.String(forgedPrefix + "liveness-" + id),
				Attributes: map[string]string{cmschema.AttrClusterID: id, cmschema.AttrClusterSetID: devenv.DefaultClusterSet, "epoch": "forged", "seq": "1", "updated": old}})
			harness.Must(t, err)
		}
	}
	t.Logf("forged a %d-character packed chunk in each of %d exported services, and a misfiled old liveness record for each of %d clusters", len(payload), n, len(f.ids))
}

// services are the ids of the Cloud Map services of a namespace.
func (f *fleet) services(t *testing.T, nsID string) iter.Seq[string] {
	return func(yield func(string) bool) {
		if nsID == "" {
			t.Fatal("a namespace the fleet writes to is missing")
		}
		p := sd.NewListServicesPaginator(f.sd, &sd.ListServicesInput{Filters: []sdtypes.ServiceFilter{{Name: sdtypes.ServiceFilterNameNamespaceId, Values: []string{nsID}}}})
		for p.HasMorePages() {
			page, err := p.NextPage(context.Background())
			harness.Must(t, err)
			for _, s := range page.Services {
				if !yield(aws.ToString(s.Id)) {
					return
				}
			}
		}
	}
}
