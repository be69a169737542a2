//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// With an invalid cluster id nothing is exported; the controller says why
// (readiness, an Event on the ClusterProperty) and starts once it is fixed.
func TestInvalidIdentityExportsNothing(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	cm := harness.CloudMap(t, cloudmaplocal.Options{})
	cl := harness.Client(t, env.Clusters[0].Config)
	ctx := context.Background()
	prop := &aboutv1alpha1.ClusterProperty{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, prop))
	prop.Spec.Value = "Not_A_DNS_Label"
	harness.Must(t, cl.Update(ctx, prop))

	probes := harness.FreeAddr(t)
	runCtx, cancel := context.WithCancel(ctx)
	wait := env.StartControllers(runCtx, cm.URL, func(*devenv.Cluster) logr.Logger { return harness.HeldLog(t) },
		func(o *controller.Options) { o.ProbeAddr = probes })
	defer func() { cancel(); _ = wait() }()

	namespace(t, cl, "ident")
	app(t, cl, "ident", "web", 1, false, httpPort(80, 8080))
	exportService(t, cl, "ident", "web")
	// The health endpoint names the failing check; the reason itself is in
	// the log and the Event (controller-runtime withholds it from HTTP).
	harness.Eventually(t, 20*time.Second, "not ready", func() error {
		resp, err := http.Get("http://" + probes + "/readyz?verbose")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == 200 || !strings.Contains(string(body), "[-]identity failed") {
			return fmt.Errorf("readyz %d: %s", resp.StatusCode, body)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, "an Event on the ClusterProperty", func() error {
		evs := &corev1.EventList{}
		if err := cl.List(ctx, evs); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "ClusterProperty" && e.Reason == "InvalidClusterIdentity" && strings.Contains(e.Message, "Not_A_DNS_Label") {
				return nil
			}
		}
		return fmt.Errorf("no InvalidClusterIdentity Event among %d", len(evs.Items))
	})
	c := cloudmaptest.ClientOf(t, cm.URL, cloudmapclient.Options{})
	time.Sleep(3 * time.Second)
	if out, err := c.ListNamespaces(ctx, &sd.ListNamespacesInput{}); err != nil || len(out.Namespaces) != 0 {
		t.Fatalf("nothing may reach Cloud Map without an identity: %v %d namespaces", err, len(out.Namespaces))
	}
	if got := condition(cl, "ident", "web", "Ready"); got != "none" {
		t.Errorf("the export was processed without an identity: Ready %s", got)
	}

	harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, prop))
	prop.Spec.Value = "cluster-1"
	harness.Must(t, cl.Update(ctx, prop))
	harness.Eventually(t, 30*time.Second, "exported once the identity is valid", wantCondition(cl, "ident", "web", "Ready", "True/Exported"))
	harness.Eventually(t, 10*time.Second, "ready", func() error {
		resp, err := http.Get("http://" + probes + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	// Ready says Cloud Map accepted the writes; their operations finish,
	// and reads show them, a few seconds later.
	harness.Eventually(t, 20*time.Second, "Cloud Map holding one export of one endpoint", func() error {
		out, err := c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("ident"), ServiceName: aws.String("web")})
		if err != nil {
			return err
		}
		var records []recordfmt.Instance
		for _, in := range out.Instances {
			records = append(records, recordfmt.Instance{ID: aws.ToString(in.InstanceId), Attrs: in.Attributes})
		}
		if exports := recordfmt.Decode(registry.Key{Namespace: "ident", Name: "web"}, records); len(exports) != 1 || len(exports[0].Endpoints) != 1 {
			return fmt.Errorf("%d instances decode to %+v", len(records), exports)
		}
		return nil
	})
}
