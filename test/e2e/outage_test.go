package e2e

import (
	"reflect"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
)

const faultDuration = 60 * time.Second

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
		scale(t, src, ns, name, replicas) // a change Cloud Map cannot take now
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
	w := worldWithoutControllers(t, 2, cloudmaplocal.Options{})
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
	scale(t, w.clients[0], ns, name, 3)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", waitPods(t, w.clients[0], ns, name, 3))
}
