//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

const (
	ownerAccount  = "111111111111"
	memberAccount = "222222222222"
)

// A clusterset across two AWS accounts: cluster-1 runs in the account that
// owns the namespaces, cluster-2 in a member account they are shared with
// (the emulator's admin /shares, as AWS RAM). Before the share the member's
// export says what is missing; after it, exports flow both ways; an unshare
// keeps the member's imports and names the share again.
func TestClusterSetAcrossAccounts(t *testing.T) {
	w := worldWithoutControllers(t, 2, cloudmaplocal.Options{Account: ownerAccount, Accounts: map[string]string{"AKIDMEMBER": memberAccount}})
	memberHost := w.env.Clusters[1].Config.Host
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		o.OwnerAccount = ownerAccount
		if o.Config.Host == memberHost {
			o.CloudMapCredentials = credentials.NewStaticCredentialsProvider("AKIDMEMBER", "secret", "")
		}
	}))
	const ns = "accounts"
	w.allNamespaces(t, ns)
	owner, member := w.clients[0], w.clients[1]

	// The member exports first: the namespace does not exist yet.
	app(t, member, ns, "web", 2, false, httpPort(80, 8080))
	exportService(t, member, ns, "web")
	harness.Eventually(t, importDeadline, "NamespaceNotShared on the member's export", wantCondition(member, ns, "web", "Ready", "False/NamespaceNotShared"))
	harness.Eventually(t, 5*time.Second, "its Warning Event", wantEvent(member, ns, "web", "NamespaceNotShared", "Warning", ownerAccount))
	if msg := conditionMessage(t, member, ns, "web"); !bytes.Contains([]byte(msg), []byte(memberAccount)) || !bytes.Contains([]byte(msg), []byte("RAM")) {
		t.Errorf("the condition should name the member account and the RAM share: %s", msg)
	}

	// The owner's export creates the namespaces; the owner shares them.
	apiIPs := func() []string {
		app(t, owner, ns, "api", 2, false, httpPort(80, 8080))
		exportService(t, owner, ns, "api")
		return waitPods(t, owner, ns, "api", 2)
	}()
	sd := w.cloudMap(t)
	arns := map[string]string{}
	harness.Eventually(t, importDeadline, "the owner's namespaces", func() error {
		for _, name := range []string{ns, cloudmap.ChangesNamespace(devenv.DefaultClusterSet)} {
			found, err := cloudmapclient.FindOwnedNamespace(context.Background(), sd, name, types.NamespaceTypeHttp, ownerAccount)
			if err != nil || found == nil {
				return fmt.Errorf("namespace %s: %v", name, err)
			}
			arns[name] = aws.ToString(found.Arn)
		}
		return nil
	})
	for _, arn := range arns {
		w.share(t, http.MethodPost, arn, memberAccount)
	}

	// Both ways: the member's export within its retry, the owner's through
	// the change records.
	webIPs := waitPods(t, member, ns, "web", 2)
	w.importedEverywhere(t, importDeadline+cloudmapRetry, ns, "web", "cluster-2", webIPs)
	w.importedEverywhere(t, importDeadline, ns, "api", "cluster-1", apiIPs)
	harness.Eventually(t, importDeadline, "the member's export Ready", wantCondition(member, ns, "web", "Ready", "True/Exported"))

	// Unsharing: the member keeps what it imported and its next export
	// says the share is missing.
	w.share(t, http.MethodDelete, arns[ns], memberAccount)
	app(t, member, ns, "late", 1, false, httpPort(80, 8080))
	exportService(t, member, ns, "late")
	harness.Eventually(t, importDeadline+cloudmapRetry, "NamespaceNotShared after the unshare", wantCondition(member, ns, "late", "Ready", "False/NamespaceNotShared"))
	time.Sleep(10 * time.Second) // past the watcher's confirmation of an absence
	w.importedEverywhere(t, time.Second, ns, "api", "cluster-1", apiIPs)
}

// cloudmapRetry is how long an export waiting for a share waits between tries.
const cloudmapRetry = 15 * time.Second

// share shares (POST) or unshares (DELETE) a namespace through the
// emulator's admin API, the RAM step.
func (w *world) share(t *testing.T, method, arn string, accounts ...string) {
	t.Helper()
	body, _ := json.Marshal(cloudmaplocal.ShareRequest{NamespaceArn: arn, Accounts: accounts})
	req, err := http.NewRequest(method, w.cm.AdminURL+"/shares", bytes.NewReader(body))
	harness.Must(t, err)
	resp, err := http.DefaultClient.Do(req)
	harness.Must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s /shares %s: %s", method, arn, resp.Status)
	}
}

func conditionMessage(t *testing.T, cl client.Client, ns, name string) string {
	t.Helper()
	se := &mcsv1beta1.ServiceExport{}
	harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se))
	for _, c := range se.Status.Conditions {
		if c.Type == "Ready" {
			return c.Message
		}
	}
	return ""
}
