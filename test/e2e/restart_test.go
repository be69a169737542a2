//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

// A controller restarted where the clusterset's records are not (a wrong
// Region, credentials of another AWS account) lists nothing and reads
// every import as exported nowhere: it keeps every import, says why on
// each, and picks up where it was once restarted right.
func TestRestartReadingTheWrongPlaceKeepsImports(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}, CloudMap: cloudmaplocal.Options{Accounts: map[string]string{"AKIDELSEWHERE": "210987654321"}}})
	stop := w.startControllers(t, nil)
	defer func() { stop() }()
	const ns = "misread"
	w.allNamespaces(t, ns)
	ips := map[string][]string{}
	for _, name := range []string{"orders", "billing"} {
		ips[name] = w.exportApp(t, ns, name, 2)
	}
	importer := w.clients[1]
	importerHost := w.env.Clusters[1].Config.Host

	for _, wrong := range []struct {
		what string
		tune func(*controller.Options)
	}{
		{"a wrong Region", func(o *controller.Options) { o.Region = "eu-west-1" }},
		{"another account's credentials", func(o *controller.Options) {
			o.CloudMapCredentials = credentials.NewStaticCredentialsProvider("AKIDELSEWHERE", "secret", "")
		}},
	} {
		stop()
		stop = w.startControllers(t, func(o *controller.Options) {
			if o.Config.Host == importerHost {
				wrong.tune(o)
			}
		})
		for _, name := range []string{"orders", "billing"} {
			harness.Eventually(t, importDeadline, "RemovalHeld on "+name+" after a restart with "+wrong.what, func() error {
				si, err := getImport(importer, ns, name)
				if err != nil {
					return err
				}
				if c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionRemovalHeld); c == nil || c.Status != "True" {
					return fmt.Errorf("condition %+v", c)
				}
				return nil
			})
			harness.Eventually(t, 5*time.Second, "its Warning Event", wantEvent(importer, ns, name, imports.ConditionRemovalHeld, corev1.EventTypeWarning, "--region"))
		}
		// Well past the 5 s confirmation of an absence: nothing changed.
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
			for name, want := range ips {
				si, err := getImport(importer, ns, name)
				slices, err2 := importSlices(importer, ns, name)
				if err != nil || err2 != nil || !reflect.DeepEqual(readyIPs(slices), want) || len(si.Spec.IPs) != 1 {
					t.Fatalf("after a restart with %s the import of %s changed: %v %v %v", wrong.what, name, readyIPs(slices), err, err2)
				}
			}
		}
	}

	// Restarted right: the imports follow changes again, the condition goes.
	stop()
	stop = w.startControllers(t, nil)
	harness.Scale(t, w.clients[0], ns, "orders", 3)
	w.importedEverywhere(t, importDeadline, ns, "orders", "cluster-1", waitPods(t, w.clients[0], ns, "orders", 3))
	harness.Eventually(t, importDeadline, "RemovalHeld cleared", func() error {
		for name := range ips {
			si, err := getImport(importer, ns, name)
			if err != nil {
				return err
			}
			if c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionRemovalHeld); c != nil {
				return fmt.Errorf("%s: %+v", name, c)
			}
		}
		return nil
	})

	// The exporter restarted with a wrong Region: billing's ServiceExport,
	// deleted meanwhile, is withdrawn there (where its records are not)
	// and let go. Its records in the right Region stay, and every importer
	// keeps importing them, until the exporter, restarted right, finds its
	// own records of a service no ServiceExport asks for, and withdraws
	// them.
	stop()
	exporterHost := w.env.Clusters[0].Config.Host
	stop = w.startControllers(t, func(o *controller.Options) {
		if o.Config.Host == exporterHost {
			o.Region = "eu-west-1"
		}
	})
	exporter := w.clients[0]
	harness.Must(t, exporter.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"}}))
	harness.Eventually(t, importDeadline, "billing's ServiceExport let go in the wrong Region", func() error {
		err := exporter.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "billing"}, &mcsv1beta1.ServiceExport{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if _, err := getImport(importer, ns, "billing"); err != nil {
		t.Fatalf("billing's records are still in the right Region, but its import went: %v", err)
	}
	stop()
	stop = w.startControllers(t, nil)
	harness.Eventually(t, importDeadline, "billing's orphaned records withdrawn, its import gone", func() error {
		if _, err := getImport(importer, ns, "billing"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("import still there: %v", err)
		}
		return nil
	})
	if _, err := getImport(importer, ns, "orders"); err != nil {
		t.Errorf("orders, still exported, lost its import: %v", err)
	}
}
