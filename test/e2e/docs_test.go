//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// The documents' commands, run as written where they can run here: the
// shell blocks are read from the files, so a test fails when a document
// changes into something that does not work.

// codeBlock is the first fenced block of a Markdown file that contains
// marker, without its fences.
func codeBlock(t *testing.T, file, marker string) string {
	t.Helper()
	raw, err := os.ReadFile(file)
	harness.Must(t, err)
	for i, part := range strings.Split(string(raw), "```") {
		// Odd parts are inside fences; the first line is the language.
		if i%2 == 1 && strings.Contains(part, marker) {
			_, body, _ := strings.Cut(part, "\n")
			return body
		}
	}
	t.Fatalf("%s has no code block with %q", file, marker)
	return ""
}

// shell runs a documented block with bash, the pinned tools first on PATH
// and KUBECONFIG set to env's, from the repository's root.
func shell(t *testing.T, env *devenv.Env, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "PATH="+devenv.BinDir()+":"+os.Getenv("PATH"), "KUBECONFIG="+env.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s\n%v: %s", script, err, out)
	}
	return string(out)
}

// helmFlags reads a documented `helm install|upgrade` command: its --set
// values (parsed as the helm CLI parses them) and its namespace.
func helmFlags(t *testing.T, command string) (map[string]any, string) {
	t.Helper()
	command = strings.ReplaceAll(command, "\\\n", " ")
	values, ns := map[string]any{}, ""
	fields := strings.Fields(command)
	for i := 0; i < len(fields)-1; i++ {
		switch fields[i] {
		case "--set":
			harness.Must(t, strvals.ParseInto(fields[i+1], values))
		case "-n", "--namespace":
			ns = fields[i+1]
		}
	}
	return values, ns
}

// helmAction is Helm's action configuration for cluster c of env, as the
// helm CLI makes it for --kube-context.
func helmAction(t *testing.T, env *devenv.Env, c *devenv.Cluster, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Context, flags.Namespace = &env.Kubeconfig, &c.ID, ptr.To(ns)
	cfg := &action.Configuration{}
	harness.Must(t, cfg.Init(flags, ns, "secret", t.Logf))
	// The dev apiserver, built from the module proxy without version
	// stamps, reports v0.0.0-master, which the chart's kubeVersion
	// constraint refuses: it is the pinned v1.34.4 (hack/tools/go.mod).
	cfg.Capabilities = chartutil.DefaultCapabilities.Copy()
	cfg.Capabilities.KubeVersion = chartutil.KubeVersion{Version: "v1.34.4", Major: "1", Minor: "34"}
	return cfg
}

// renderNotes renders the chart's NOTES.txt as helm template would (no
// cluster to look anything up in).
func renderNotes(t *testing.T, ch *chart.Chart, values map[string]any) string {
	t.Helper()
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: release, Namespace: releaseNS, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	harness.Must(t, err)
	files, err := engine.Render(ch, vals)
	harness.Must(t, err)
	return files["clustermap/templates/NOTES.txt"]
}

// The notes warn, in a cluster older than Kubernetes 1.31, that
// local-first routing is not available there, and not in one that has it.
func TestNotesWarnLocalityNeeds131(t *testing.T) {
	ch := loadChart(t)
	for version, warn := range map[string]bool{"v1.30.4": true, "v1.31.0": false, "v1.34.1": false} {
		caps := chartutil.DefaultCapabilities.Copy()
		caps.KubeVersion = chartutil.KubeVersion{Version: version, Major: "1", Minor: strings.Split(version, ".")[1]}
		vals, err := chartutil.ToRenderValues(ch, map[string]any{"region": "us-west-2"}, chartutil.ReleaseOptions{Name: release, Namespace: releaseNS, IsInstall: true, Revision: 1}, caps)
		harness.Must(t, err)
		files, err := engine.Render(ch, vals)
		harness.Must(t, err)
		notes := files["clustermap/templates/NOTES.txt"]
		if got := strings.Contains(notes, "needs Kubernetes 1.31"); got != warn {
			t.Errorf("Kubernetes %s: the notes warn about locality: %v, want %v\n%s", version, got, warn, notes)
		}
	}
}

var corefileBlock = regexp.MustCompile(`(?m)^clusterset\.local:53 \{\n(?:    .*\n)*\}`)

// The Corefile block the chart's notes print works in the pinned CoreDNS
// (built from the module proxy with the plugins it uses): CoreDNS starts
// with it and answers clusterset.local names from the forwarded server,
// over UDP and TCP. The notes once named a hostname, which CoreDNS refuses
// to start with. Here the DNS Service's address is 127.0.53.53, where a
// stand-in server answers; the block's port becomes a free one.
func TestNotesCorefileBlock(t *testing.T) {
	ch := loadChart(t)
	v := modeValues(true, false, false, true)
	v["dns"] = map[string]any{"enabled": true, "clusterIP": "127.0.53.53"}
	block := corefileBlock.FindString(renderNotes(t, ch, v))
	if !strings.Contains(block, "forward . 127.0.53.53\n") {
		t.Fatalf("the notes' Corefile block %q does not forward to dns.clusterIP", block)
	}
	upstream := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if q := r.Question[0]; q.Name == "web.demo.svc.clusterset.local." && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR("web.demo.svc.clusterset.local. 5 IN A 10.1.2.3")
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	for _, network := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: "127.0.53.53:53", Net: network, Handler: upstream}
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ListenAndServe() }()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("the stand-in DNS server cannot listen on 127.0.53.53:53 (%s)", network)
		}
		t.Cleanup(func() { _ = srv.Shutdown() })
	}

	addr := harness.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	corefile := filepath.Join(t.TempDir(), "Corefile")
	harness.Must(t, os.WriteFile(corefile, []byte(strings.Replace(block, "clusterset.local:53 {", "clusterset.local:"+port+" {", 1)+"\n"), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, filepath.Join(devenv.BinDir(), "coredns"), "-conf", corefile)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	harness.Must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cancel(); <-exited })
	for _, network := range []string{"udp", "tcp"} {
		harness.Eventually(t, 20*time.Second, "CoreDNS answers over "+network+" from the forwarded server", func() error {
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("CoreDNS exited with the notes' block (%v):\n%s\n%s", err, block, out.String())
			default:
			}
			m := new(dns.Msg)
			m.SetQuestion("web.demo.svc.clusterset.local.", dns.TypeA)
			r, _, err := (&dns.Client{Net: network, Timeout: 2 * time.Second}).Exchange(m, "127.0.0.1:"+port)
			if err != nil {
				return err
			}
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.1.2.3" {
				return fmt.Errorf("answer %v", r.Answer)
			}
			return nil
		})
	}
}

// docs/install.md's helm install, in a cluster whose ClusterProperties were
// made with kubectl as docs/eks-walkthrough.md does (and as the AWS
// controller's users did): the chart leaves ClusterProperties with its
// values alone, and refuses other values, saying how to adopt them. With
// dns on and no dns.clusterIP the notes say how to read the address; once
// the Service exists they print it.
func TestInstallDocs(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	c := env.Clusters[0]
	ctx := context.Background()
	cl := harness.Client(t, c.Config)

	// The CRDs as docs/install.md's upgrade step applies them, then the
	// walkthrough's cluster identity, its --context made this cluster's.
	crdStep := regexp.MustCompile("`(kubectl apply --server-side\\s+--force-conflicts -f charts/clustermap/crds/)`").FindStringSubmatch(readFile(t, "../../docs/install.md"))
	if crdStep == nil {
		t.Fatal("docs/install.md no longer says how to apply the CRDs")
	}
	t.Log(shell(t, env, strings.Join(strings.Fields(crdStep[1]), " ")))
	identity := codeBlock(t, "../../docs/eks-walkthrough.md", "kind: ClusterProperty")
	t.Log(shell(t, env, strings.ReplaceAll(identity, "--context cluster-1", "--context "+c.ID)))

	ch := loadChart(t)
	install := codeBlock(t, "../../docs/install.md", "helm install clustermap oci://")
	values, ns := helmFlags(t, install)
	if ns != releaseNS || values["clusterProperties"] == nil {
		t.Fatalf("docs/install.md's helm install changed (namespace %q, values %v): bring this test to it", ns, values)
	}
	cfg := helmAction(t, env, c, ns)
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = release, ns, true
	rel, err := in.RunWithContext(ctx, ch, values)
	if err != nil {
		t.Fatalf("docs/install.md's helm install, ClusterProperties made with kubectl first: %v", err)
	}
	if rel.Info.Status != helmrelease.StatusDeployed {
		t.Errorf("helm install: %s", rel.Info.Status)
	}
	for name, want := range map[string]string{"cluster.clusterset.k8s.io": "cls1", "clusterset.k8s.io": "clusterset1"} {
		p := &unstructured.Unstructured{}
		p.SetAPIVersion("about.k8s.io/v1alpha1")
		p.SetKind("ClusterProperty")
		harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: name}, p))
		if got, _, _ := unstructured.NestedString(p.Object, "spec", "value"); got != want {
			t.Errorf("ClusterProperty %s = %q after the install, want %q as it was", name, got, want)
		}
	}

	// The controller's pods are admitted at the chart's default priority,
	// system-cluster-critical, outside kube-system.
	harness.Eventually(t, time.Minute, "a controller pod", func() error {
		pods := &corev1.PodList{}
		if err := cl.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "clustermap-controller"}); err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return fmt.Errorf("none: see the ReplicaSet's events")
		}
		if p := pods.Items[0].Spec.PriorityClassName; p != "system-cluster-critical" {
			return fmt.Errorf("pod %s has priority class %q", pods.Items[0].Name, p)
		}
		return nil
	})

	upgrade := func(set ...string) (*helmrelease.Release, error) {
		up := action.NewUpgrade(cfg)
		up.Namespace, up.ResetThenReuseValues = ns, true
		v := map[string]any{}
		for _, s := range set {
			harness.Must(t, strvals.ParseInto(s, v))
		}
		return up.RunWithContext(ctx, release, ch, v)
	}
	// Another id than the cluster has: refused, naming both and the way
	// to change it; changed that way, the upgrade goes through.
	_, err = upgrade("clusterProperties.clusterId=cls9")
	change := regexp.MustCompile(`\((kubectl patch [^)]*)\)`).FindStringSubmatch(fmt.Sprint(err))
	if err == nil || !strings.Contains(err.Error(), `ClusterProperty cluster.clusterset.k8s.io exists with value "cls1"`) || change == nil {
		t.Fatalf("an upgrade to another cluster id: %v; want it refused, naming the ClusterProperty and how to change it", err)
	}
	t.Log(shell(t, env, change[1]))
	_, err = upgrade("clusterProperties.clusterId=cls9")
	harness.Must(t, err)
	p := &unstructured.Unstructured{}
	p.SetAPIVersion("about.k8s.io/v1alpha1")
	p.SetKind("ClusterProperty")
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: "cluster.clusterset.k8s.io"}, p))
	if got, _, _ := unstructured.NestedString(p.Object, "spec", "value"); got != "cls9" {
		t.Errorf("changed as the error said, the ClusterProperty holds %q, want cls9", got)
	}

	// DNS on, no fixed address: the notes say how to read it, and the
	// command they give reads it.
	rel, err = upgrade("dns.enabled=true", "dns.replicas=1")
	harness.Must(t, err)
	read := regexp.MustCompile(`(?m)^\s*(kubectl .*jsonpath=.*)$`).FindStringSubmatch(rel.Info.Notes)
	if !strings.Contains(rel.Info.Notes, "forward . ADDRESS") || read == nil {
		t.Fatalf("notes with dns on and no clusterIP:\n%s\nwant ADDRESS and the command that reads it", rel.Info.Notes)
	}
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: release + "-dns"}, svc))
	got := strings.TrimSpace(shell(t, env, read[1]+" --context "+c.ID))
	if _, err := netip.ParseAddr(got); err != nil || got != svc.Spec.ClusterIP {
		t.Errorf("the notes' command printed %q, want the DNS Service's ClusterIP %s", got, svc.Spec.ClusterIP)
	}
	// The next upgrade's notes print the address itself.
	rel, err = upgrade()
	harness.Must(t, err)
	if !strings.Contains(rel.Info.Notes, "forward . "+svc.Spec.ClusterIP+"\n") {
		t.Errorf("notes once the DNS Service exists:\n%s\nwant forward . %s", rel.Info.Notes, svc.Spec.ClusterIP)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	harness.Must(t, err)
	return string(raw)
}

// docs/install.md's kustomize overlay, run as written with the pinned
// kustomize and kubectl (the release's URL made this checkout's
// config/default): the Region reaches the controller's ConfigMap, which
// the Deployment reads. `kustomize edit add configmap --behavior=merge` in
// config/default itself, as documented before, made a kustomization that
// no longer builds (nothing to merge into in the same kustomization).
func TestKustomizeRegionOverlay(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	ctx := context.Background()
	cl := harness.Client(t, env.Clusters[0].Config)
	base, err := filepath.Abs("../../config/default")
	harness.Must(t, err)
	block := codeBlock(t, "../../docs/install.md", "kustomize create")
	remote := regexp.MustCompile(`'https://github\.com/clustermap/clustermap/config/default\?ref=[^']*'`)
	if !remote.MatchString(block) {
		t.Fatalf("docs/install.md's overlay no longer names the release's config/default:\n%s", block)
	}
	// kustomize takes a base by a relative path only.
	dir := t.TempDir()
	rel, err := filepath.Rel(filepath.Join(dir, "clustermap-cluster-1"), base)
	harness.Must(t, err)
	t.Log(shell(t, env, "cd "+dir+"\n"+remote.ReplaceAllString(block, rel)))

	cms := &corev1.ConfigMapList{}
	harness.Must(t, cl.List(ctx, cms, client.InNamespace("clustermap-system")))
	var region, name string
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "clustermap-aws-") {
			region, name = cm.Data["AWS_REGION"], cm.Name
		}
	}
	if region != "us-west-2" {
		t.Fatalf("ConfigMap %q has AWS_REGION %q, want the overlay's us-west-2", name, region)
	}
	dep := &appsv1.Deployment{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: "clustermap-system", Name: "clustermap-controller"}, dep))
	refs := fmt.Sprint(dep.Spec.Template.Spec.Containers[0].EnvFrom, dep.Spec.Template.Spec.Containers[0].Env)
	if !strings.Contains(refs, name) {
		t.Errorf("the controller Deployment does not read %s: %s", name, refs)
	}
}

// docs/install.md's storedVersions step, run as written: in a cluster
// whose ServiceExports and ServiceImports were stored as v1alpha1 (the
// AWS controller's CRDs, as before a migration) and whose CRDs are now
// clustermap's, it leaves storedVersions [v1beta1] and every object
// readable.
func TestStoredVersionsDoc(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	ctx := context.Background()
	cl := harness.Client(t, env.Clusters[0].Config)
	replaceCRDs(t, cl, loadObjects(t, filepath.Join(devenv.BinDir(), "crds", "mcs-v1alpha1"), 2))
	namespace(t, cl, "shop")
	for kind, spec := range map[string]map[string]any{
		"ServiceExport": {},
		"ServiceImport": {"type": "ClusterSetIP", "ports": []any{map[string]any{"port": int64(80), "protocol": "TCP"}}},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": kind,
			"metadata": map[string]any{"name": "cart", "namespace": "shop"}, "spec": spec}}
		harness.Must(t, cl.Create(ctx, u))
	}
	harness.Must(t, applyAll(ctx, cl, crds(t, loadChart(t))))
	stored := func(name string) []string {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: name}, crd))
		v, _, _ := unstructured.NestedStringSlice(crd.Object, "status", "storedVersions")
		return v
	}
	if v := stored("serviceexports.multicluster.x-k8s.io"); len(v) != 2 {
		t.Fatalf("storedVersions %v before the step: want v1alpha1 and v1beta1, else this test proves nothing", v)
	}
	t.Log(shell(t, env, codeBlock(t, "../../docs/install.md", "storedVersions")))
	for _, r := range []string{"serviceexports", "serviceimports"} {
		if v := stored(r + ".multicluster.x-k8s.io"); len(v) != 1 || v[0] != "v1beta1" {
			t.Errorf("%s storedVersions %v after the step, want [v1beta1]", r, v)
		}
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("multicluster.x-k8s.io/v1beta1")
		l.SetKind(map[string]string{"serviceexports": "ServiceExportList", "serviceimports": "ServiceImportList"}[r])
		harness.Must(t, cl.List(ctx, l))
		if len(l.Items) != 1 {
			t.Errorf("%d %s after the step, want the one made", len(l.Items), r)
		}
	}
}

// TestLabDocBlocks runs docs/lab.md's local-cluster blocks as written,
// from a directory of their own holding bin/: `dev up`, kubectl against
// the kubeconfig it writes, `dev down`; then the data plane block, whose
// nc and nslookup must be answered.
func TestLabDocBlocks(t *testing.T) {
	dir := t.TempDir()
	harness.Must(t, os.Symlink(devenv.BinDir(), filepath.Join(dir, "bin")))
	run := func(script string) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+devenv.BinDir()+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s\n%v: %s", script, err, out)
		}
		return string(out)
	}
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(dir, "bin", "clustermap-dev"), "down")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("clustermap-dev down: %v %s", err, out)
		}
	})
	out := run(codeBlock(t, "../../docs/lab.md", "bin/clustermap-dev up --clusters 3"))
	for _, want := range []string{"cluster.clusterset.k8s.io", "cluster-2", "clusterset-dev"} {
		if !strings.Contains(out, want) {
			t.Errorf("the local clusters block printed no %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".clustermap", "dev", "kubeconfig")); !os.IsNotExist(err) {
		t.Errorf("dev down left the kubeconfig: %v", err)
	}
	out = run(codeBlock(t, "../../docs/lab.md", "bin/clustermap-dev up --dataplane --all-pods"))
	if !regexp.MustCompile(`pod echo-[a-z0-9]+-[a-z0-9]+\n`).MatchString(out) {
		t.Errorf("the data plane block's nc was not answered by an echo pod:\n%s", out)
	}
	if !regexp.MustCompile(`Name:\s+echo\.default\.svc\.cluster\.local\s+Address:\s+10\.`).MatchString(out) {
		t.Errorf("the data plane block's nslookup found no address:\n%s", out)
	}
}
