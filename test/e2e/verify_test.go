//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/verify"
	"github.com/clustermap/clustermap/test/harness"
)

// TestVerify runs `clustermap verify` on two clusters with a data plane,
// as a user would, the probe pods running clustermap's image (the host's
// binary in the lab): every check passes; then, with cluster-1's route to
// cluster-2's pods cut, it fails naming the route, and with UDP to
// cluster-2's pods dropped (as a security group allowing TCP only would),
// it names the firewall. Every run deletes its namespaces.
func TestVerify(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2, Dataplane: true, AllPods: true}, Controllers: true})
	fabric, err := dataplane.Load(filepath.Join(w.env.StateDir, "fabric.json"))
	harness.Must(t, err)
	node1, node2 := fabric.NodeNS("cluster-1"), fabric.NodeNS("cluster-2")

	// A namespace that exists is refused, and left alone.
	if rep, err := w.verify(t, "--namespace", "kube-public"); err == nil || len(rep.Failures) != 2 || !strings.Contains(rep.Failures[0].Got, "namespace kube-public exists") {
		t.Errorf("verify in an existing namespace: %v, %+v", err, rep.Failures)
	}
	for i, cl := range w.clients {
		if err := cl.Get(context.Background(), client.ObjectKey{Name: "kube-public"}, &corev1.Namespace{}); err != nil {
			t.Fatalf("%s: kube-public: %v", w.env.Clusters[i].ID, err)
		}
	}

	// The walkthrough's command as written: a matrix of ok, exit 0.
	out := shell(t, w.env, codeBlock(t, "../../docs/eks-walkthrough.md", "clustermap verify --context"))
	if !strings.Contains(out, "cluster-1  ok     ok         ok") || !strings.Contains(out, " checks, 0 failed") {
		t.Errorf("the walkthrough's clustermap verify printed:\n%s", out)
	}

	w.verifyPasses(t)

	// cluster-1's node forgets its route to cluster-2's pods.
	cidr := w.env.Clusters[1].PodCIDRs[0]
	ipCmd(t, "-n", node1, "route", "del", cidr)
	rep, err := w.verify(t)
	if err == nil {
		t.Error("verify passed with a route cut")
	}
	// Dropped, as a VPC drops what no route covers: "route or security
	// group", both ways (cluster-2's answers are lost on cluster-1's node).
	for _, c := range [][2]string{{"cluster-1", "cluster-2"}, {"cluster-2", "cluster-1"}} {
		if f := failure(rep, c[0], c[1], "tcp to the pod"); f == nil || !strings.HasPrefix(f.Cause, "route") {
			t.Errorf("%s -> %s over TCP: %+v, want a route failure", c[0], c[1], f)
		}
	}
	if f := failure(rep, "cluster-1", "cluster-1", ""); f != nil {
		t.Errorf("cluster-1 -> cluster-1 failed: %+v", f)
	}
	ipCmd(t, "-n", node1, "route", "add", cidr, "via", fabric.NodeAddrs(2)[0].String())

	// cluster-2's node drops UDP to its pods' probe port from elsewhere.
	nft(t, node2, "add table inet verifytest",
		"add chain inet verifytest forwarded { type filter hook forward priority 0 ; }",
		fmt.Sprintf("add rule inet verifytest forwarded iifname eth0 udp dport %d drop", verify.Port))
	rep, err = w.verify(t)
	if err == nil {
		t.Error("verify passed with UDP dropped")
	}
	if f := failure(rep, "cluster-1", "cluster-2", "udp to the pod"); f == nil || !strings.HasPrefix(f.Cause, "firewall:") {
		t.Errorf("cluster-1 -> cluster-2 over UDP: %+v, want a firewall failure", f)
	}
	if f := failure(rep, "cluster-1", "cluster-2", "tcp to the pod"); f != nil {
		t.Errorf("TCP failed too: %+v", f)
	}
	nft(t, node2, "delete table inet verifytest")
}

// verifyPasses runs verify on a working clusterset: every check passes,
// each cluster probed in both families and importing both clusters.
func (w *world) verifyPasses(t *testing.T) {
	t.Helper()
	rep, err := w.verify(t)
	if err != nil || len(rep.Failures) != 0 || rep.Checks < 20 {
		t.Fatalf("verify on a working clusterset: %v, %d checks, failures %+v", err, rep.Checks, rep.Failures)
	}
	for _, c := range rep.Clusters {
		if len(c.PodIPs) != 2 || len(c.ImportClusters) != 2 {
			t.Errorf("%s: probe addresses %v, imported from %v: want both families, both clusters", c.ID, c.PodIPs, c.ImportClusters)
		}
	}
}

// verify runs the clustermap binary's verify on both clusters and checks
// that it left no namespace of its own behind.
func (w *world) verify(t *testing.T, args ...string) (verify.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args = append([]string{"verify", "--kubeconfig", w.env.Kubeconfig, "--context", "cluster-1,cluster-2",
		"--image", dataplane.ClustermapImage + ":test", "-o", "json"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(devenv.BinDir(), "clustermap"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("clustermap verify: %v\n%s", err, stderr.String())
	var rep verify.Report
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		t.Fatalf("verify's report: %v\n%s", jerr, out)
	}
	if rep.Namespace == "kube-public" { // refused: nothing of verify's to look for
		return rep, err
	}
	for i, cl := range w.clients {
		if err := cl.Get(ctx, client.ObjectKey{Name: rep.Namespace}, &corev1.Namespace{}); rep.Namespace == "" || !apierrors.IsNotFound(err) {
			t.Errorf("%s: verify left its namespace %q (%v)", w.env.Clusters[i].ID, rep.Namespace, err)
		}
	}
	return rep, err
}

// failure is the first failure from one cluster to another whose check
// starts with what.
func failure(rep verify.Report, from, to, what string) *verify.Failure {
	for _, f := range rep.Failures {
		if f.From == from && f.To == to && strings.HasPrefix(f.What, what) {
			return &f
		}
	}
	return nil
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(dataplane.IPPath(), args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v %s", args, err, out)
	}
}

func nft(t *testing.T, netns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		args := append([]string{"netns", "exec", netns, "nft"}, strings.Fields(c)...)
		if out, err := exec.Command(dataplane.IPPath(), args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v %s", c, err, out)
		}
	}
}
