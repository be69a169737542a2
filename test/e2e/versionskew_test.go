//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// A clusterset mid-upgrade: cluster-1 still writes the previous record
// format (no version), cluster-2 a format newer than this release's. Both
// exports merge into every import; the newer format is reported on the
// import; once both run this release, both records carry its version.
func TestVersionSkew(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	versions := map[string]int{"cluster-1": 1, "cluster-2": recordfmt.RecordVersion + 1}
	start := func(skewed bool) func() {
		return w.startControllers(t, func(o *controller.Options) {
			for _, c := range w.env.Clusters {
				if c.Config == o.Config && skewed {
					o.RecordVersion = versions[c.ID]
				}
			}
		})
	}
	stop := start(true)
	t.Cleanup(func() { stop() })
	const ns, name = "skew", "cache"
	w.allNamespaces(t, ns)
	var all []string
	for i, cl := range w.clients {
		app(t, cl, ns, name, 2, false, httpPort(6379, 6379))
		se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: mcsv1beta1.ServiceExportSpec{ExportedLabels: map[string]string{"tier": "cache"}}}
		harness.Must(t, cl.Create(context.Background(), se))
		all = append(all, waitPods(t, cl, ns, name, 2)...)
		if i == 0 {
			// cluster-1's export is the older: its labels are the import's.
			w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", all[:2])
		}
	}
	sort.Strings(all)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1,cluster-2", all)
	for i, cl := range w.clients {
		// Eventually: a per-endpoint export's service record (which holds
		// the labels) and its endpoint records are separate operations,
		// and a read may show the endpoints first.
		harness.Eventually(t, importDeadline, w.env.Clusters[i].ID+": the previous format's exported labels", func() error {
			si, err := getImport(cl, ns, name)
			if err == nil && si.Labels["tier"] != "cache" {
				err = fmt.Errorf("labels %v", si.Labels)
			}
			return err
		})
		harness.Eventually(t, importDeadline, "NewerRecordFormat Event", wantEvent(cl, ns, name, "NewerRecordFormat", corev1.EventTypeWarning,
			fmt.Sprintf("cluster cluster-2 writes record format %d", recordfmt.RecordVersion+1)))
	}
	// Eventually: a service record goes in after its endpoint records,
	// and Cloud Map's reads trail its writes.
	c := w.cloudMap(t)
	harness.Eventually(t, importDeadline, "records in each writer's format", func() error {
		return checkRecordVersions(c, ns, name, map[string]string{"cluster-1": "", "cluster-2": fmt.Sprint(recordfmt.RecordVersion + 1)})
	})

	// Both upgraded (or downgraded) to this release: records rewritten in
	// its format, packed once each sees the other reads them, and no
	// import loses an endpoint through the switch (sampled all along).
	// First past the read lag: a controller that starts within it may
	// read a state older than its imports hold (a pod not yet ready) and
	// write it back for a poll; that is the lag's, not the switch's.
	time.Sleep(cloudmaplocal.AWS().ReadLag + time.Second)
	stop()
	sampled := make(chan []string)
	sampling, done := context.WithCancel(context.Background())
	go func() { sampled <- w.sampleImports(sampling, ns, name, all) }()
	stop = start(false)
	harness.Eventually(t, importDeadline, "records in this release's format", func() error {
		return checkRecordVersions(c, ns, name, map[string]string{"cluster-1": fmt.Sprint(recordfmt.RecordVersion), "cluster-2": fmt.Sprint(recordfmt.RecordVersion)})
	})
	harness.Eventually(t, importDeadline, "packed records", func() error {
		return checkPacked(c, ns, name, 2)
	})
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1,cluster-2", all)
	time.Sleep(5 * time.Second) // imports after the last write
	done()
	if short := <-sampled; len(short) > 0 {
		t.Errorf("an import lost endpoints through the switch to packed records: %v", short)
	}
}

// sampleImports reads every cluster's import until ctx ends, and tells
// each read that lacked one of the ready addresses want.
func (w *world) sampleImports(ctx context.Context, ns, name string, want []string) []string {
	var short []string
	reads := 0
	for ctx.Err() == nil {
		for i, cl := range w.clients {
			slices, err := importSlices(cl, ns, name)
			if err != nil {
				continue // an apiserver hiccup is no import's state
			}
			reads++
			if got := readyIPs(slices); !reflect.DeepEqual(got, want) {
				short = append(short, fmt.Sprintf("%s at %s: %v", w.env.Clusters[i].ID, time.Now().Format("15:04:05.000"), got))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if reads == 0 {
		short = append(short, "no import read")
	}
	return short
}

// checkPacked says whether every service record of a service says packed
// endpoint records, and Cloud Map holds one instance per cluster.
func checkPacked(c *sd.Client, ns, name string, clusters int) error {
	out, err := c.DiscoverInstances(context.Background(), &sd.DiscoverInstancesInput{NamespaceName: aws.String(ns), ServiceName: aws.String(name)})
	if err != nil {
		return err
	}
	formats := map[string]string{}
	for _, in := range out.Instances {
		formats[aws.ToString(in.InstanceId)] = in.Attributes[recordfmt.AttrEndpointFormat]
	}
	if len(out.Instances) != clusters {
		return fmt.Errorf("%d instances, want %d (one per cluster): %v", len(out.Instances), clusters, formats)
	}
	for id, f := range formats {
		if f != "packed" {
			return fmt.Errorf("instance %s writes endpoints %q", id, f)
		}
	}
	return nil
}

// checkRecordVersions reads each cluster's service record straight from
// Cloud Map.
func checkRecordVersions(c *sd.Client, ns, name string, want map[string]string) error {
	out, err := c.DiscoverInstances(context.Background(), &sd.DiscoverInstancesInput{NamespaceName: aws.String(ns), ServiceName: aws.String(name),
		QueryParameters: map[string]string{recordfmt.AttrRecord: "service"}})
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, in := range out.Instances {
		got[in.Attributes[recordfmt.AttrClusterID]] = in.Attributes[recordfmt.AttrRecordVersion]
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("record versions by cluster %v, want %v", got, want)
	}
	return nil
}
