//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

const (
	ownerAccount  = "111111111111"
	memberAccount = "222222222222"
)

// A clusterset across two AWS accounts and two Regions: cluster-1 runs in
// the account that owns the namespaces (us-east-1), cluster-2 in a member
// account they are shared with (us-east-1; the emulator's admin /shares
// as AWS RAM), cluster-3 in the owner account in eu-west-1. Every cluster
// reads both Regions. Before the share the member's export says what is
// missing; after it, exports of both families flow every way; a conflict
// across Regions resolves by the usual rules; an outage of eu-west-1 keeps
// its imports while us-east-1 goes on converging; an unshare keeps the
// member's imports and names the share again.
func TestClusterSetAcrossAccountsAndRegions(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 3}, CloudMap: cloudmaplocal.Options{Account: ownerAccount, Accounts: map[string]string{"AKIDMEMBER": memberAccount}}})
	memberHost, westHost := w.env.Clusters[1].Config.Host, w.env.Clusters[2].Config.Host
	var ownerCalls, memberCalls cloudmapclient.Calls
	tune := func(o *controller.Options) {
		o.OwnerAccount = ownerAccount
		o.Regions = []string{"us-east-1", "eu-west-1"}
		o.OnCloudMapCall = ownerCalls.Record
		switch o.Config.Host {
		case memberHost:
			o.CloudMapCredentials = credentials.NewStaticCredentialsProvider("AKIDMEMBER", "secret", "")
			o.OnCloudMapCall = memberCalls.Record
		case westHost:
			o.Region = "eu-west-1"
		}
	}
	stop := w.startControllers(t, tune)
	t.Cleanup(func() { stop() })
	const ns = "accounts"
	w.allNamespaces(t, ns)
	owner, member, west := w.clients[0], w.clients[1], w.clients[2]

	// The member exports first: the namespace does not exist yet.
	dualApp(t, member, ns, "web", 2)
	exportService(t, member, ns, "web")
	harness.Eventually(t, importDeadline, "NamespaceNotShared on the member's export", wantCondition(member, ns, "web", "Ready", "False/NamespaceNotShared"))
	harness.Eventually(t, 5*time.Second, "its Warning Event", wantEvent(member, ns, "web", "NamespaceNotShared", "Warning", ownerAccount))
	if msg := conditionMessage(t, member, ns, "web"); !strings.Contains(msg, memberAccount) || !strings.Contains(msg, "RAM") {
		t.Errorf("the condition should name the member account and the RAM share: %s", msg)
	}

	// The owner's clusters export in both Regions, which makes the
	// namespaces there; the owner shares them with the member account.
	dualApp(t, owner, ns, "api", 2)
	exportService(t, owner, ns, "api")
	dualApp(t, west, ns, "far", 2)
	exportService(t, west, ns, "far")
	for _, region := range []string{"us-east-1", "eu-west-1"} {
		for _, arn := range w.ownerNamespaces(t, region, ns, cloudmap.ChangesNamespace(devenv.DefaultClusterSet)) {
			w.share(t, http.MethodPost, arn, memberAccount)
		}
	}

	// Every way, both address families (2 pods, an IPv4 and an IPv6
	// address each): the member's export within its retry, the others
	// through the change records, across Regions.
	w.importedEverywhere(t, importDeadline+cloudmapRetry, ns, "web", "cluster-2", waitPods(t, member, ns, "web", 4))
	harness.Eventually(t, importDeadline, "the member's export Ready", wantCondition(member, ns, "web", "Ready", "True/Exported"))
	apiIPs := waitPods(t, owner, ns, "api", 4)
	w.importedEverywhere(t, importDeadline, ns, "api", "cluster-1", apiIPs)
	farIPs := waitPods(t, west, ns, "far", 4)
	w.importedEverywhere(t, importDeadline, ns, "far", "cluster-3", farIPs)
	// Every controller restarts: each lists what the clusterset holds in
	// both accounts' view (ListServices) and keeps every import.
	stop()
	stop = w.startControllers(t, tune)
	time.Sleep(3 * time.Second) // past the restarted controllers' first reads
	w.importedEverywhere(t, importDeadline, ns, "web", "cluster-2", waitPods(t, member, ns, "web", 4))
	w.importedEverywhere(t, importDeadline, ns, "api", "cluster-1", apiIPs)
	w.importedEverywhere(t, importDeadline, ns, "far", "cluster-3", farIPs)
	// One VIP per family and DNS answers for both, from the other Region,
	// in a namespace the owner made and shared beforehand (as a platform
	// team's infrastructure code would).
	sdWest := cloudmaptest.ClientOf(t, w.cm.URL, cloudmapclient.Options{Region: "eu-west-1"})
	cloudmaptest.Namespace(t, sdWest, "dual-west")
	w.share(t, http.MethodPost, w.ownerNamespaces(t, "eu-west-1", "dual-west")[0], memberAccount)
	w.familyExportFrom(t, 2, "dual-west", []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol})

	// A conflict across Regions: the oldest export's port wins everywhere.
	exportInTurn(t, ns, "clash", "True/PortConflict",
		func() { app(t, owner, ns, "clash", 1, false, httpPort(80, 8080)) }, owner,
		func() { app(t, west, ns, "clash", 1, false, httpPort(81, 8080)) }, west)
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline, "the oldest port in "+w.env.Clusters[i].ID, func() error {
			si, err := getImport(cl, ns, "clash")
			if err != nil {
				return err
			}
			if len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || clustersOf(si) != "cluster-1,cluster-3" {
				return fmt.Errorf("ports %+v clusters %s", si.Spec.Ports, clustersOf(si))
			}
			return nil
		})
	}

	// eu-west-1 goes down: its exports stay imported, us-east-1 goes on.
	w.setFaults(t, `{"outage": true, "regions": ["eu-west-1"]}`)
	app(t, owner, ns, "during", 1, false, httpPort(80, 8080))
	exportService(t, owner, ns, "during")
	w.importedEverywhere(t, importDeadline, ns, "during", "cluster-1", waitPods(t, owner, ns, "during", 1))
	time.Sleep(10 * time.Second) // past the watcher's confirmation of an absence
	w.importedEverywhere(t, time.Second, ns, "far", "cluster-3", farIPs)
	w.setFaults(t, `{}`)

	// Unexports in both accounts: each removes its records and the Cloud
	// Map service it created, and every import goes.
	for _, u := range []struct {
		cl   client.Client
		name string
	}{{member, "web"}, {west, "far"}} {
		harness.Must(t, u.cl.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: u.name}}))
	}
	for i, cl := range w.clients {
		for _, name := range []string{"web", "far"} {
			harness.Eventually(t, importDeadline, fmt.Sprintf("%s/%s gone from %s", ns, name, w.env.Clusters[i].ID), func() error {
				if _, err := getImport(cl, ns, name); !apierrors.IsNotFound(err) {
					return fmt.Errorf("import still there (%v)", err)
				}
				return nil
			})
		}
	}
	for region, name := range map[string]string{"us-east-1": "web", "eu-west-1": "far"} {
		harness.Eventually(t, importDeadline, "Cloud Map service "+name+" deleted by its creator", func() error {
			c := cloudmaptest.ClientOf(t, w.cm.URL, cloudmapclient.Options{Region: region})
			out, err := c.ListServices(context.Background(), &sd.ListServicesInput{Filters: []types.ServiceFilter{
				{Name: types.ServiceFilterNameNamespaceId, Values: []string{w.ownerNamespaces(t, region, ns)[0]}}}})
			if err != nil {
				return err
			}
			for _, svc := range out.Services {
				if aws.ToString(svc.Name) == name {
					return fmt.Errorf("service %s still there", name)
				}
			}
			return nil
		})
	}

	// Unsharing: the member keeps what it imported and its next export
	// says the share is missing.
	w.share(t, http.MethodDelete, w.ownerNamespaces(t, "us-east-1", ns)[0], memberAccount)
	app(t, member, ns, "late", 1, false, httpPort(80, 8080))
	exportService(t, member, ns, "late")
	harness.Eventually(t, importDeadline+cloudmapRetry, "NamespaceNotShared after the unshare", wantCondition(member, ns, "late", "Ready", "False/NamespaceNotShared"))
	time.Sleep(10 * time.Second)
	w.importedEverywhere(t, time.Second, ns, "api", "cluster-1", apiIPs)

	t.Run("the IAM policies allow exactly the calls made", func(t *testing.T) {
		checkPolicy(t, "mcs-shared-owner", ownerCalls.Snapshot())
		checkPolicy(t, "mcs-shared-member", memberCalls.Snapshot())
	})

	// Restarts that cannot read the owner's namespace list none of it: the
	// member restarted after the unshare, then with a mistyped owner
	// account, keeps every import (each is read, and reads unshared).
	for _, owner := range []string{ownerAccount, "999999999999"} {
		stop()
		stop = w.startControllers(t, func(o *controller.Options) {
			tune(o)
			if o.Config.Host == memberHost {
				o.OwnerAccount = owner
			}
		})
		time.Sleep(15 * time.Second) // past the first reads and a confirmed absence
		w.importedEverywhere(t, time.Second, ns, "api", "cluster-1", apiIPs)
	}
}

// ownerNamespaces waits for the owner account's namespaces of these names
// in a Region and returns their ARNs.
func (w *world) ownerNamespaces(t *testing.T, region string, names ...string) []string {
	t.Helper()
	c := cloudmaptest.ClientOf(t, w.cm.URL, cloudmapclient.Options{Region: region})
	arns := make([]string, len(names))
	harness.Eventually(t, importDeadline, "the owner's namespaces in "+region, func() error {
		for i, name := range names {
			found, err := cloudmapclient.FindOwnedNamespace(context.Background(), c, name, types.NamespaceTypeHttp, ownerAccount)
			if err != nil || found == nil {
				return fmt.Errorf("namespace %s: %v", name, err)
			}
			arns[i] = aws.ToString(found.Arn)
		}
		return nil
	})
	return arns
}

// setFaults replaces the emulator's faults through its admin API.
func (w *world) setFaults(t *testing.T, faults string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, w.cm.AdminURL+"/faults", strings.NewReader(faults))
	harness.Must(t, err)
	resp, err := http.DefaultClient.Do(req)
	harness.Must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /faults %s: %s", faults, resp.Status)
	}
}

// dualApp is an app whose Service prefers both address families.
func dualApp(t *testing.T, cl client.Client, ns, name string, replicas int32) {
	t.Helper()
	app(t, cl, ns, name, replicas, false, httpPort(80, 8080))
	updateService(t, cl, ns, name, func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack) })
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
