//go:build e2e

package e2e

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// faultDuration is how long each fault holds: 60 polls of the test's
// 500 ms period, beyond every confirmation window of the watcher (5-10 s).
const faultDuration = 30 * time.Second

// While Cloud Map is down or throttles everything, every cluster keeps its
// imports exactly as they were; afterwards the changes made meanwhile
// arrive everywhere.
func (w *world) outage(t *testing.T) {
	const ns, name = "outage", "steady"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	before := w.exportApp(t, ns, name, 3)

	for _, fault := range []struct {
		name   string
		faults cloudmaplocal.Faults
	}{
		{"outage", cloudmaplocal.Faults{Outage: true}},
		{"throttling", cloudmaplocal.Faults{RateLimits: map[string]cloudmaplocal.RateLimit{"*": {Rate: 0.000001, Burst: 1}}}},
	} {
		replicas := int32(5)
		if fault.name == "throttling" {
			replicas = 2
		}
		w.cm.SetFaults(fault.faults)
		start := time.Now()
		harness.Scale(t, src, ns, name, replicas) // a change Cloud Map cannot take now
		for time.Since(start) < faultDuration {
			for i, cl := range w.clients {
				si, err := getImport(cl, ns, name)
				if err != nil {
					t.Fatalf("%s after %v: %s lost its ServiceImport: %v", fault.name, time.Since(start).Round(time.Second), w.env.Clusters[i].ID, err)
				}
				slices, err := importSlices(cl, ns, name)
				if err != nil || !reflect.DeepEqual(readyIPs(slices), before) || len(si.Spec.IPs) != 1 {
					t.Fatalf("%s after %v: %s's import changed: endpoints %v (want %v), ips %v, err %v",
						fault.name, time.Since(start).Round(time.Second), w.env.Clusters[i].ID, readyIPs(slices), before, si.Spec.IPs, err)
				}
			}
			time.Sleep(2 * time.Second)
		}
		w.cm.SetFaults(cloudmaplocal.Faults{})
		after := waitPods(t, src, ns, name, int(replicas))
		recovered := time.Now()
		w.importedEverywhere(t, 60*time.Second, ns, name, "cluster-1", after)
		t.Logf("after %s: converged %v after recovery", fault.name, time.Since(recovered).Round(time.Millisecond))
		before = after
	}
	if got := condition(src, ns, name, "Ready"); got != "True/Exported" {
		t.Errorf("after recovery the export is %s", got)
	}
}

// Controllers restarted while Cloud Map is down must not take the view they
// have not read yet for "exported nowhere".
func TestRestartDuringOutageKeepsImports(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	stop := w.startControllers(t, nil)
	const ns, name = "restart", "kept"
	w.allNamespaces(t, ns)
	ips := w.exportApp(t, ns, name, 2)
	stop()

	w.cm.SetFaults(cloudmaplocal.Faults{Outage: true})
	stop = w.startControllers(t, nil)
	defer func() { stop() }()
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for i, cl := range w.clients {
			if slices, err := importSlices(cl, ns, name); err != nil || !reflect.DeepEqual(readyIPs(slices), ips) {
				t.Fatalf("%s's import changed after a restart during an outage: %v %v", w.env.Clusters[i].ID, readyIPs(slices), err)
			}
		}
	}
	w.cm.SetFaults(cloudmaplocal.Faults{})
	harness.Scale(t, w.clients[0], ns, name, 3)
	ips = waitPods(t, w.clients[0], ns, name, 3)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)

	// One service whose reads keep failing through a restart: its imports
	// stay as they are, and block neither the first sync nor other imports.
	stop()
	w.cm.SetFaults(cloudmaplocal.Faults{FailReadsOf: []string{ns + "/" + name}})
	stop = w.startControllers(t, nil)
	fresh := w.exportApp(t, ns, "fresh", 2)
	harness.Scale(t, w.clients[0], ns, name, 1)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for i, cl := range w.clients {
			if slices, err := importSlices(cl, ns, name); err != nil || !reflect.DeepEqual(readyIPs(slices), ips) {
				t.Fatalf("%s's import of the unreadable service changed: %v %v", w.env.Clusters[i].ID, readyIPs(slices), err)
			}
		}
	}
	w.cm.SetFaults(cloudmaplocal.Faults{})
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", waitPods(t, w.clients[0], ns, name, 1))

	// A record that decodes to no valid endpoint is skipped with a Warning
	// Event naming its cluster and instance; the valid endpoints import.
	// A cluster with no other record exports nothing: it is not among the
	// import's clusters.
	c := w.cloudMap(t)
	registerInstance(t, c, w.serviceID(t, c, ns, "fresh"), "bad-record", map[string]string{recordfmt.AttrIPv4: "10.9.9.9", recordfmt.AttrPort: "8080", recordfmt.AttrHostname: "Not_A_Label",
		recordfmt.AttrClusterID: "cluster-9", recordfmt.AttrClusterSetID: devenv.DefaultClusterSet})
	w.importedEverywhere(t, importDeadline, ns, "fresh", "cluster-1", fresh)
	for _, cl := range w.clients {
		harness.Eventually(t, importDeadline, "the InvalidRecord Event", wantEvent(cl, ns, "fresh", "InvalidRecord", corev1.EventTypeWarning, "cluster cluster-9 exports a record that was skipped: instance bad-record"))
	}
}
