//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

// The conformance deadline for imports to appear and go.
const importDeadline = 20 * time.Second

// TestMCS runs the Multi-Cluster Services scenarios on one world of three
// clusters; each scenario has a namespace of its own.
func TestMCS(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 3}, Controllers: true})
	t.Run("ClusterSetIP export is imported into every cluster", w.clusterSetIP)
	t.Run("headless export keeps hostnames", w.headless)
	t.Run("scaling is reflected in every cluster", w.scaling)
	t.Run("exports of two clusters are merged", w.twoExporters)
	t.Run("port and type conflicts: the oldest wins", w.conflicts)
	t.Run("differing port sets, labels and annotations", w.differingSets)
	t.Run("a dual-stack export", w.dualStack)
	t.Run("unexport removes imports and cleans Cloud Map", w.unexport)
	t.Run("ExternalName and missing Services are rejected", w.invalid)
	t.Run("a namespace missing in a cluster is imported once created", w.lateNamespace)
	t.Run("another clusterset in the same account stays apart", w.otherClusterSet)
	t.Run("an export in the AWS controller's schema is imported", w.awsSchema)
	t.Run("a write Cloud Map fails after accepting it is reported and made good", w.lateFailure)
	t.Run("an export too large for Cloud Map is reported", w.tooLarge)
	// Last: it takes Cloud Map away from everything.
	t.Run("imports survive a Cloud Map outage and throttling", w.outage)
	t.Run("the IAM policy allows exactly the calls made", func(t *testing.T) { checkPolicy(t, "mcs", w.calls.Snapshot()) })
}

func (w *world) clusterSetIP(t *testing.T) {
	const ns, name = "cs-ip", "web"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
	}
	src := w.clients[0]
	app(t, src, ns, name, 3, false, httpPort(80, 8080))
	exportService(t, src, ns, name)
	var podIPs []string
	harness.Eventually(t, importDeadline, "pods ready in cluster-1", func() error {
		var err error
		if podIPs, err = readyPodIPs(src, ns, name); err == nil && len(podIPs) != 3 {
			err = fmt.Errorf("%d ready pods", len(podIPs))
		}
		return err
	})
	for i, cl := range w.clients {
		id := w.env.Clusters[i].ID
		harness.Eventually(t, importDeadline, "the import in "+id, func() error {
			si, err := getImport(cl, ns, name)
			if err != nil {
				return err
			}
			if si.Spec.Type != mcsv1beta1.ClusterSetIP || len(si.Spec.Ports) != 1 || si.Spec.Ports[0] != (mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}) {
				return fmt.Errorf("spec %+v", si.Spec)
			}
			if clustersOf(si) != "cluster-1" {
				return fmt.Errorf("status.clusters %q", clustersOf(si))
			}
			derived := &corev1.Service{}
			if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: imports.DerivedName(name)}, derived); err != nil {
				return err
			}
			if got := si.Annotations[imports.DerivedServiceAnnotation]; got != derived.Name {
				return fmt.Errorf("%s is %q, want the derived Service %s (Gateway API implementations look there)", imports.DerivedServiceAnnotation, got, derived.Name)
			}
			if len(si.Spec.IPs) != 1 || len(si.Spec.IPFamilies) != 1 || !reflect.DeepEqual(si.Spec.IPs, derived.Spec.ClusterIPs) || derived.Spec.Selector != nil {
				return fmt.Errorf("ips %v, ipFamilies %v, derived Service %v selector %v", si.Spec.IPs, si.Spec.IPFamilies, derived.Spec.ClusterIPs, derived.Spec.Selector)
			}
			// As the upstream conformance suite asks: the Service's
			// affinity, None by default.
			if si.Spec.SessionAffinity != corev1.ServiceAffinityNone || si.Spec.SessionAffinityConfig != nil {
				return fmt.Errorf("session affinity %q %+v, want the Service's None", si.Spec.SessionAffinity, si.Spec.SessionAffinityConfig)
			}
			if !prefixContains(w.env.Clusters[i].ServiceCIDRs[0], si.Spec.IPs[0]) {
				return fmt.Errorf("VIP %s is not from %s's own service range", si.Spec.IPs[0], id)
			}
			slices, err := importSlices(cl, ns, name)
			if err != nil {
				return err
			}
			if got := readyIPs(slices); !reflect.DeepEqual(got, podIPs) {
				return fmt.Errorf("imported endpoints %v, want cluster-1's pods %v", got, podIPs)
			}
			for _, s := range slices {
				if s.Labels[mcsv1beta1.LabelSourceCluster] != "cluster-1" || s.Labels[discoveryv1.LabelServiceName] != derived.Name ||
					s.Labels[discoveryv1.LabelManagedBy] != imports.ManagedBy || len(s.Endpoints) > imports.MaxEndpointsPerSlice ||
					len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != si.UID {
					return fmt.Errorf("slice %s labels %v owners %v", s.Name, s.Labels, s.OwnerReferences)
				}
				if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
					return fmt.Errorf("slice ports %+v", s.Ports)
				}
			}
			return nil
		})
	}
	harness.Eventually(t, 5*time.Second, "conditions", func() error {
		for _, c := range []struct {
			t    mcsv1beta1.ServiceExportConditionType
			want string
		}{{"Valid", "True/Valid"}, {"Ready", "True/Exported"}, {"Conflict", "False/NoConflicts"}} {
			if err := wantCondition(src, ns, name, c.t, c.want)(); err != nil {
				return err
			}
		}
		return nil
	})
	// Client IP affinity and its timeout reach every import through the
	// registry's records.
	updateService(t, src, ns, name, func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
	})
	w.eachImport(t, ns, name, "client IP affinity for 600 s", func(si *mcsv1beta1.ServiceImport) error {
		if c := si.Spec.SessionAffinityConfig; si.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || c == nil || c.ClientIP == nil || ptr.Deref(c.ClientIP.TimeoutSeconds, 0) != 600 {
			return fmt.Errorf("session affinity %q %+v", si.Spec.SessionAffinity, c)
		}
		return nil
	})
}
