//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// Three clusters each export a Service of 180 pods with 2 ports (1,080
// endpoint records, past Cloud Map's 1,000 instances per service when
// written one per endpoint and port, as the AWS controller does): every
// export is Ready, every cluster imports all 540 pods with both ports,
// and Cloud Map holds a handful of instances.
func TestThreeLargeExportsFit(t *testing.T) {
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 3}, Controllers: true})
	const ns, name, pods = "scale", "big", 180
	w.allNamespaces(t, ns)
	metrics := corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9090)}
	var all []string
	for _, cl := range w.clients {
		app(t, cl, ns, name, pods, false, httpPort(80, 8080), metrics)
		exportService(t, cl, ns, name)
		all = append(all, waitPods(t, cl, ns, name, pods)...)
	}
	sort.Strings(all)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1,cluster-2,cluster-3", all)
	for i, cl := range w.clients {
		slices, err := importSlices(cl, ns, name)
		harness.Must(t, err)
		for _, s := range slices {
			if len(s.Ports) != 2 {
				t.Errorf("%s: imported slice %s has %d ports, want 2", w.env.Clusters[i].ID, s.Name, len(s.Ports))
			}
		}
		se := &mcsv1beta1.ServiceExport{}
		harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se))
		if c := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady)); c == nil || c.Status != "True" {
			t.Errorf("%s: export not Ready: %+v", w.env.Clusters[i].ID, c)
		}
	}
	out, err := w.cloudMap(t).DiscoverInstances(context.Background(), &sd.DiscoverInstancesInput{NamespaceName: aws.String(ns), ServiceName: aws.String(name)})
	harness.Must(t, err)
	byCluster := map[string]int{}
	for _, in := range out.Instances {
		byCluster[in.Attributes[recordfmt.AttrClusterID]]++
	}
	t.Logf("3 clusters x %d pods x 2 ports (%d endpoint records): Cloud Map instances by cluster %v", pods, 3*pods*2, byCluster)
	if len(out.Instances) > 3*2 {
		t.Errorf("%d instances for 3 exports of %d pods: %v", len(out.Instances), pods, fmt.Sprint(byCluster))
	}
}
