//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/clusterstatus"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// statusOf runs the real `clustermap status` over every context of the
// fleet's kubeconfig.
func statusOf(t *testing.T, w *world, output string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), "status", "--kubeconfig", w.env.Kubeconfig, "--all-contexts", "-o", output)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, errb.String())
	}
	return out.String(), err
}

func statusJSON(t *testing.T, w *world) ([]clusterstatus.Cluster, error) {
	out, runErr := statusOf(t, w, "json")
	var doc struct{ Clusters []clusterstatus.Cluster }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, fmt.Errorf("status -o json: %v (%v)\n%s", err, runErr, out)
	}
	return doc.Clusters, runErr
}

func TestStatus(t *testing.T) {
	w := newWorld(t, 2, cloudmaplocal.Options{})
	const ns, name = "status", "web"
	w.allNamespaces(t, ns)
	ips := w.exportApp(t, ns, name, 3)

	harness.Eventually(t, 30*time.Second, "status shows the clusterset", func() error {
		clusters, err := statusJSON(t, w)
		if err != nil {
			return err
		}
		if len(clusters) != 2 {
			return fmt.Errorf("%d clusters", len(clusters))
		}
		for i, c := range clusters {
			id := w.env.Clusters[i].ID
			if c.ClusterID != id || c.ClusterSet != "clusterset-dev" || c.Controller == nil || c.Controller.LastCloudMap == nil {
				return fmt.Errorf("%s: identity %s/%s, controller %+v", id, c.ClusterID, c.ClusterSet, c.Controller)
			}
			if len(c.Stuck) > 0 {
				return fmt.Errorf("%s: stuck %v", id, c.Stuck)
			}
			if len(c.Imports) != 1 || c.Imports[0].Name != name || strings.Join(c.Imports[0].Clusters, ",") != "cluster-1" ||
				c.Imports[0].Ready["IPv4"]+c.Imports[0].Ready["IPv6"] != len(ips) {
				return fmt.Errorf("%s: imports %+v, want %s from cluster-1 with %d ready endpoints", id, c.Imports, name, len(ips))
			}
		}
		if e := clusters[0].Exports; len(e) != 1 || e[0].Ready != "True/Exported" || !strings.HasPrefix(e[0].Valid, "True/") {
			return fmt.Errorf("cluster-1 exports %+v", e)
		}
		return nil
	})
	table, err := statusOf(t, w, "table")
	harness.Must(t, err)
	for _, want := range []string{"CLUSTER cluster-1", "CLUSTER cluster-2", ns + "/" + name, "True/Exported", "nothing stuck"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("clustermap status:\n%s", table)

	// Cloud Map away: every cluster says so, and status fails.
	w.cm.SetFaults(cloudmaplocal.Faults{Outage: true})
	harness.Eventually(t, 30*time.Second, "status reports the registry unreachable", func() error {
		clusters, err := statusJSON(t, w)
		if err == nil {
			return fmt.Errorf("status should fail while Cloud Map is unreachable")
		}
		for _, c := range clusters {
			if len(c.Stuck) == 0 || !strings.Contains(strings.Join(c.Stuck, ";"), "Cloud Map unreachable") {
				return fmt.Errorf("%s: stuck %v", c.ClusterID, c.Stuck)
			}
		}
		return nil
	})
	w.cm.SetFaults(cloudmaplocal.Faults{})
	harness.Eventually(t, 30*time.Second, "status clear again", func() error {
		_, err := statusJSON(t, w)
		return err
	})

	// A cluster that cannot be read is reported, not skipped.
	harness.Must(t, w.env.StopCluster(context.Background(), w.env.Clusters[1]))
	clusters, err := statusJSON(t, w)
	if err == nil || len(clusters) != 2 || clusters[1].Error == "" {
		t.Errorf("a stopped cluster should be reported unreachable: %+v (%v)", clusters, err)
	}
	harness.Must(t, w.env.StartCluster(context.Background(), w.env.Clusters[1]))
}
