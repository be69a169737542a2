//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// registerExport writes an export of another cluster into Cloud Map, as
// that cluster's clustermap would.
func (w *world) registerExport(t *testing.T, e registry.Export) {
	t.Helper()
	ctx := context.Background()
	c := w.cloudMap(t)
	found, err := cloudmapclient.FindNamespace(ctx, c, e.Namespace, sdtypes.NamespaceTypeHttp)
	harness.Must(t, err)
	var nsID string
	if found != nil {
		nsID = aws.ToString(found.Id)
	} else {
		nsID = cloudmaptest.Namespace(t, c, e.Namespace)
	}
	svcID := w.serviceIDIfAny(t, c, e.Name)
	if svcID == "" {
		svc, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(e.Name), NamespaceId: aws.String(nsID)})
		harness.Must(t, err)
		svcID = aws.ToString(svc.Service.Id)
	}
	recs, err := recordfmt.Encode(e, "clustermap test", recordfmt.RecordVersion)
	harness.Must(t, err)
	for id, attrs := range recs {
		registerInstance(t, c, svcID, id, attrs)
	}
}

// A single-stack cluster imports a dual-stack export in the family it
// has (one VIP, Ready), and an export of only the family it lacks is
// Ready=False with reason IPFamilyNotSupported, as the MCS API names it.
func TestSingleStackImportsDualStack(t *testing.T) {
	inParallel(t)
	for _, c := range []struct {
		cluster, other corev1.IPFamily
		mine, theirs   string
	}{
		{corev1.IPv4Protocol, corev1.IPv6Protocol, "10.77.0.1", "fd77::1"},
		{corev1.IPv6Protocol, corev1.IPv4Protocol, "fd77::1", "10.77.0.1"},
	} {
		t.Run(string(c.cluster)+"-only", func(t *testing.T) {
			family := devenv.IPv4
			if c.cluster == corev1.IPv6Protocol {
				family = devenv.IPv6
			}
			w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 1, IPFamily: family}, Controllers: true})
			const ns = "families"
			w.allNamespaces(t, ns)
			http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
			export := func(name string, families []corev1.IPFamily, ips ...string) registry.Export {
				e := registry.Export{ClusterSet: devenv.DefaultClusterSet, Cluster: "cluster-9", Key: registry.Key{Namespace: ns, Name: name},
					Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{http}, IPFamilies: families, Created: time.Now()}
				for _, ip := range ips {
					e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ip, Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Ready: true, ServicePort: http})
				}
				return e
			}
			w.registerExport(t, export("dual", []corev1.IPFamily{c.other, c.cluster}, c.theirs, c.mine))
			harness.Eventually(t, importDeadline, "the dual-stack import, in this cluster's family", func() error {
				si, err := getImport(w.clients[0], ns, "dual")
				if err != nil {
					return err
				}
				ready := meta.FindStatusCondition(si.Status.Conditions, string(mcsv1beta1.ServiceImportConditionReady))
				if len(si.Spec.IPs) != 1 || ready == nil || ready.Status != "True" {
					return fmt.Errorf("ips %v, Ready %+v", si.Spec.IPs, ready)
				}
				if !prefixContains(w.env.Clusters[0].ServiceCIDRs[0], si.Spec.IPs[0]) {
					return fmt.Errorf("VIP %s outside the cluster's service range %s", si.Spec.IPs[0], w.env.Clusters[0].ServiceCIDRs[0])
				}
				return nil
			})
			// A change of the export updates the single-stack derived
			// Service in place: its VIP stays.
			vip := importIPs(t, w.clients[0], ns, "dual")
			changed := export("dual", []corev1.IPFamily{c.other, c.cluster}, c.theirs, c.mine)
			changed.Ports[0].Port = 81
			w.registerExport(t, changed)
			harness.Eventually(t, importDeadline, "the changed port, the VIP kept", func() error {
				si, err := getImport(w.clients[0], ns, "dual")
				if err != nil {
					return err
				}
				ready := meta.FindStatusCondition(si.Status.Conditions, string(mcsv1beta1.ServiceImportConditionReady))
				if len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 81 || !slices.Equal(si.Spec.IPs, vip) || ready == nil || ready.Status != "True" {
					return fmt.Errorf("ports %v ips %v (was %v), Ready %+v", si.Spec.Ports, si.Spec.IPs, vip, ready)
				}
				return nil
			})
			w.registerExport(t, export("foreign", []corev1.IPFamily{c.other}, c.theirs))
			harness.Eventually(t, importDeadline, "IPFamilyNotSupported", func() error {
				si, err := getImport(w.clients[0], ns, "foreign")
				if err != nil {
					return err
				}
				ready := meta.FindStatusCondition(si.Status.Conditions, string(mcsv1beta1.ServiceImportConditionReady))
				if ready == nil || ready.Status != "False" || ready.Reason != string(mcsv1beta1.ServiceImportReasonIPFamilyNotSupported) {
					return fmt.Errorf("Ready %+v", ready)
				}
				return nil
			})
		})
	}
}

// serviceIDIfAny is the id of the Cloud Map service of this name (the
// test holds one namespace), or "" when there is none.
func (w *world) serviceIDIfAny(t *testing.T, c *sd.Client, name string) string {
	t.Helper()
	out, err := c.ListServices(context.Background(), &sd.ListServicesInput{})
	harness.Must(t, err)
	for _, s := range out.Services {
		if aws.ToString(s.Name) == name {
			return aws.ToString(s.Id)
		}
	}
	return ""
}

func importIPs(t *testing.T, cl client.Client, ns, name string) []string {
	t.Helper()
	si, err := getImport(cl, ns, name)
	harness.Must(t, err)
	return si.Spec.IPs
}
