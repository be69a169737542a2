//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/test/harness"
)

// localFirst: a Service exported from both clusters with the PreferClose
// annotation. The clusters' nodes are in one zone id under two zone names
// (two AWS accounts). Requests from cluster-2's pod stay in cluster-2
// while it has ready endpoints, go to cluster-1 when its Deployment scales
// to 0, and come back when it returns; on the stock kube-proxy, which
// follows the imported slices' zone hints.
func (d *dpWorld) localFirst(t *testing.T) {
	const name, port = "near", 43
	host := name + "." + d.ns + ".svc.clusterset.local"
	ctx := context.Background()
	for i, cl := range d.clients {
		var nodes corev1.NodeList
		harness.Must(t, cl.List(ctx, &nodes))
		for _, n := range nodes.Items {
			n.Labels[locality.LabelZone] = fmt.Sprintf("us-east-1%c", 'a'+i)
			n.Labels[locality.LabelZoneID] = "use1-az1"
			harness.Must(t, cl.Update(ctx, &n))
		}
	}
	for _, cl := range d.clients {
		listener(t, cl, d.ns, name, 2, port, nil)
		harness.Must(t, cl.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ns,
			Annotations: map[string]string{export.AnnotationTrafficDistribution: corev1.ServiceTrafficDistributionPreferClose}}}))
	}
	here := d.clients[1]
	harness.Eventually(t, time.Minute, "the import lists both clusters, cluster-2's endpoints hinted for its zone", func() error {
		var list discoveryv1.EndpointSliceList
		if err := here.List(ctx, &list, client.InNamespace(d.ns), client.MatchingLabels{mcsv1beta1.LabelServiceName: name}); err != nil {
			return err
		}
		hinted := map[string]string{}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if ep.Hints != nil && len(ep.Hints.ForZones) > 0 {
					hinted[s.Labels[mcsv1beta1.LabelSourceCluster]] = ep.Hints.ForZones[0].Name
				}
			}
		}
		if hinted["cluster-1"] != locality.Nowhere || hinted["cluster-2"] != "us-east-1b" {
			return fmt.Errorf("hints by cluster %v", hinted)
		}
		return nil
	})
	stays := func(cluster string, n int) func() error {
		return func() error {
			if got := d.answering(t, n, "tcp", host, port); !slices.Equal(got, []string{cluster}) {
				return fmt.Errorf("%d requests answered by %v, want %s only", n, got, cluster)
			}
			return nil
		}
	}
	harness.Eventually(t, time.Minute, "20 of 20 requests answered in cluster-2", stays("cluster-2", 20))

	scale := func(replicas int32) {
		dep := &appsv1.Deployment{}
		harness.Must(t, here.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: name}, dep))
		dep.Spec.Replicas = ptr.To(replicas)
		harness.Must(t, here.Update(ctx, dep))
	}
	scale(0)
	gone := time.Now()
	harness.Eventually(t, time.Minute, "requests fail over to cluster-1", func() error {
		a, err := d.nc("tcp", nil, host, port)
		if err != nil || a.cluster != "cluster-1" {
			return fmt.Errorf("answer %v %v", a, err)
		}
		return nil
	})
	t.Logf("first answer from cluster-1 %v after cluster-2 scaled to 0", time.Since(gone).Round(100*time.Millisecond))
	harness.Eventually(t, time.Minute, "10 of 10 requests answered in cluster-1", stays("cluster-1", 10))
	scale(2)
	harness.Eventually(t, 2*time.Minute, "20 of 20 requests answered in cluster-2 again", stays("cluster-2", 20))
}
