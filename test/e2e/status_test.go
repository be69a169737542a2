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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/clusterstatus"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/test/harness"
)

// statusOf runs the real `clustermap status` over every context of the
// fleet's kubeconfig.
func statusOf(t *testing.T, w *world, output string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), append([]string{"status", "--kubeconfig", w.env.Kubeconfig, "--all-contexts", "-o", output}, args...)...)
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
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	// No controller yet, nor its namespace: status says exactly that.
	clusters, err := statusJSON(t, w)
	if err == nil || len(clusters) != 2 || !strings.Contains(strings.Join(clusters[0].Stuck, ";"), "namespace clustermap-system does not exist and no namespace holds a clustermap-status Lease") {
		t.Errorf("without a controller, status should name the missing namespace: %+v (%v)", clusters, err)
	}
	// Controllers run as processes outside the clusters do (--kubeconfig),
	// with no namespace made for them; cluster-2's reports in a namespace
	// of its own.
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		if o.Config.Host == w.env.Clusters[1].Config.Host {
			o.StatusNamespace = "platform"
		}
	}))
	harness.Eventually(t, 30*time.Second, "the controllers create their status namespaces", func() error {
		for i, ns := range []string{kube.DefaultStatusNamespace, "platform"} {
			n := &corev1.Namespace{}
			if err := w.clients[i].Get(context.Background(), client.ObjectKey{Name: ns}, n); err != nil {
				return err
			}
			if n.Labels[statuslease.ManagedByLabel] != statuslease.ManagedBy {
				return fmt.Errorf("namespace %s labels %v", ns, n.Labels)
			}
		}
		return nil
	})
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
			if i == 1 && (c.Controller.Namespace != "platform" || !strings.Contains(strings.Join(c.Notes, ";"), "pass --status-namespace platform")) {
				return fmt.Errorf("%s: controller in namespace %q, notes %v: want platform, and a note saying so", id, c.Controller.Namespace, c.Notes)
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
	for _, want := range []string{"CLUSTER cluster-1", "CLUSTER cluster-2", ns + "/" + name, "True/Exported", "nothing stuck", "nothing failing"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("clustermap status:\n%s", table)

	// An export of no Service fails: status lists it and exits non-zero;
	// --report-only lists it and exits 0.
	ghost := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ghost"}}
	harness.Must(t, w.clients[0].Create(context.Background(), ghost))
	harness.Eventually(t, 30*time.Second, "status lists the failing export", func() error {
		clusters, err := statusJSON(t, w)
		if err == nil {
			return fmt.Errorf("status passed with an export of no Service")
		}
		if len(clusters) == 0 || !strings.Contains(strings.Join(clusters[0].Failing, ";"), "ServiceExport "+ns+"/ghost: Valid False/NoService") {
			return fmt.Errorf("failing %v", clusters)
		}
		return nil
	})
	if out, err := statusOf(t, w, "table", "--report-only"); err != nil || !strings.Contains(out, "FAILING: ServiceExport "+ns+"/ghost") {
		t.Errorf("status --report-only: %v\n%s", err, out)
	}
	harness.Must(t, w.clients[0].Delete(context.Background(), ghost))

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
	clusters, err = statusJSON(t, w)
	if err == nil || len(clusters) != 2 || clusters[1].Error == "" {
		t.Errorf("a stopped cluster should be reported unreachable: %+v (%v)", clusters, err)
	}
	harness.Must(t, w.env.StartCluster(context.Background(), w.env.Clusters[1]))
}
