//go:build e2e

// Package release tests `make release`: apart from test/e2e so that its
// builds run beside the other packages' tests.
package release

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/image"
	"github.com/clustermap/clustermap/test/harness"
)

const release, releaseNS = "clustermap", "clustermap-system"

// TestRelease runs `make release` into a temporary directory and checks
// what a user downloads: the checksums verify, the native CLI prints the
// version and the others are built for their platform with it, the image
// is multi-platform and tagged, the packaged chart carries the version and
// installs (Helm's own install, into a cluster), the SBOM lists the
// binary's Go modules, and the notes are the CHANGELOG's section. It is
// also the test that the CLI builds for every platform a user's laptop or
// cluster runs (make release builds each one).
func TestRelease(t *testing.T) {
	ch, err := loader.Load("../../charts/clustermap")
	harness.Must(t, err)
	version := ch.Metadata.AppVersion // the version the tree is cut for; CHANGELOG.md has its section
	out := t.TempDir()
	// A cosign key pair, as a mirror signing with its own key makes one:
	// make release signs the checksums with it.
	keys := t.TempDir()
	cosign := func(args ...string) ([]byte, error) {
		cmd := exec.Command(filepath.Join(devenv.BinDir(), "cosign"), args...)
		cmd.Dir, cmd.Env = keys, append(os.Environ(), "COSIGN_PASSWORD=release-test")
		return cmd.CombinedOutput()
	}
	if b, err := cosign("generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, b)
	}
	make := exec.Command("make", "-C", "../..", "release", "VERSION="+version, "RELEASE_DIR="+out)
	make.Env = append(os.Environ(), "COSIGN_KEY="+filepath.Join(keys, "cosign.key"), "COSIGN_PASSWORD=release-test")
	if b, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, b)
	}
	chartFile := "clustermap-" + strings.TrimPrefix(version, "v") + ".tgz"
	crdFile := "clustermap-" + version + "-crds.yaml"
	want := []string{chartFile, crdFile, "clustermap-" + version + "-oci.tar", "clustermap-" + version + ".cdx.json", "RELEASE_NOTES.md",
		"clustermap-" + version + "-image-linux-amd64.tar", "clustermap-" + version + "-image-linux-arm64.tar"}
	for _, p := range []string{"linux-amd64", "linux-arm64", "darwin-amd64", "darwin-arm64"} {
		want = append(want, "clustermap-"+version+"-"+p)
	}

	t.Run("checksums verify", func(t *testing.T) {
		sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
		harness.Must(t, err)
		var listed []string
		for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
			listed = append(listed, strings.Fields(line)[1])
		}
		slices.Sort(listed)
		slices.Sort(want)
		if !slices.Equal(listed, want) {
			t.Errorf("SHA256SUMS lists %v, want %v", listed, want)
		}
		check := exec.Command("sha256sum", "-c", "SHA256SUMS")
		check.Dir = out
		if b, err := check.CombinedOutput(); err != nil {
			t.Errorf("sha256sum -c: %v\n%s", err, b)
		}
	})

	t.Run("the checksums' signature verifies with the key, and a changed file does not", func(t *testing.T) {
		sums, bundle := filepath.Join(out, "SHA256SUMS"), filepath.Join(out, "SHA256SUMS.sigstore.json")
		if b, err := cosign("verify-blob", "--key", "cosign.pub", "--bundle", bundle, "--insecure-ignore-tlog=true", sums); err != nil {
			t.Errorf("cosign verify-blob: %v\n%s", err, b)
		}
		data, err := os.ReadFile(sums)
		harness.Must(t, err)
		forged := filepath.Join(t.TempDir(), "SHA256SUMS")
		harness.Must(t, os.WriteFile(forged, append(data, []byte("0000  evil\n")...), 0o644))
		if b, err := cosign("verify-blob", "--key", "cosign.pub", "--bundle", bundle, "--insecure-ignore-tlog=true", forged); err == nil {
			t.Errorf("cosign verify-blob accepted changed checksums:\n%s", b)
		}
	})

	t.Run("the image, pushed and signed with the key, verifies by tag", func(t *testing.T) {
		dir := t.TempDir()
		untar(t, filepath.Join(out, "clustermap-"+version+"-oci.tar"), dir)
		idx, err := layout.ImageIndexFromPath(dir)
		harness.Must(t, err)
		top, err := idx.IndexManifest()
		harness.Must(t, err)
		inner, err := idx.ImageIndex(top.Manifests[0].Digest)
		harness.Must(t, err)
		reg := httptest.NewServer(registry.New())
		t.Cleanup(reg.Close)
		host := strings.TrimPrefix(reg.URL, "http://")
		tag, err := name.ParseReference(host + "/clustermap:" + version)
		harness.Must(t, err)
		harness.Must(t, remote.WriteIndex(tag, inner))
		digest, err := inner.Digest()
		harness.Must(t, err)
		if b, err := cosign("sign", "--yes", "--key", "cosign.key", "--tlog-upload=false", "--allow-http-registry", host+"/clustermap@"+digest.String()); err != nil {
			t.Fatalf("cosign sign: %v\n%s", err, b)
		}
		if b, err := cosign("verify", "--key", "cosign.pub", "--insecure-ignore-tlog=true", "--allow-http-registry", tag.String()); err != nil {
			t.Errorf("cosign verify: %v\n%s", err, b)
		}
		other, _, err := cosignKeyPair(t)
		harness.Must(t, err)
		if b, err := cosign("verify", "--key", other, "--insecure-ignore-tlog=true", "--allow-http-registry", tag.String()); err == nil {
			t.Errorf("cosign verify accepted another key's check:\n%s", b)
		}
	})

	t.Run("the CLI is built for each platform with the version", func(t *testing.T) {
		native := filepath.Join(out, "clustermap-"+version+"-"+runtime.GOOS+"-"+runtime.GOARCH)
		b, err := exec.Command(native, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(b), "clustermap "+version+" (") {
			t.Errorf("%s version: %q (%v)", native, b, err)
		}
		for _, p := range []string{"linux-amd64", "linux-arm64", "darwin-amd64", "darwin-arm64"} {
			goos, goarch, _ := strings.Cut(p, "-")
			file := filepath.Join(out, "clustermap-"+version+"-"+p)
			b, err := exec.Command("go", "version", "-m", file).CombinedOutput()
			info := string(b)
			if err != nil || !strings.Contains(info, "GOOS="+goos) || !strings.Contains(info, "GOARCH="+goarch) || !strings.Contains(info, "CGO_ENABLED=0") {
				t.Errorf("%s: %v\n%s", p, err, info)
			}
			// -trimpath leaves -ldflags out of the build info: the stamped
			// version string is looked for in the binary itself.
			data, err := os.ReadFile(file)
			harness.Must(t, err)
			if !bytes.Contains(data, []byte(version)) {
				t.Errorf("%s: no version %s in the binary", p, version)
			}
		}
	})

	t.Run("the image is multi-platform and tagged", func(t *testing.T) {
		dir := t.TempDir()
		untar(t, filepath.Join(out, "clustermap-"+version+"-oci.tar"), dir)
		idx, err := layout.ImageIndexFromPath(dir)
		harness.Must(t, err)
		top, err := idx.IndexManifest()
		harness.Must(t, err)
		if len(top.Manifests) != 1 || top.Manifests[0].Annotations[image.RefName] != version {
			t.Fatalf("OCI archive index %+v: want one entry tagged %s", top.Manifests, version)
		}
		inner, err := idx.ImageIndex(top.Manifests[0].Digest)
		harness.Must(t, err)
		m, err := inner.IndexManifest()
		harness.Must(t, err)
		var plats []string
		for _, d := range m.Manifests {
			plats = append(plats, d.Platform.OS+"/"+d.Platform.Architecture)
		}
		if slices.Sort(plats); !slices.Equal(plats, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("image platforms %v", plats)
		}
		for _, arch := range []string{"amd64", "arm64"} {
			img, err := tarball.ImageFromPath(filepath.Join(out, "clustermap-"+version+"-image-linux-"+arch+".tar"), nil)
			harness.Must(t, err)
			cfg, err := img.ConfigFile()
			harness.Must(t, err)
			if cfg.Architecture != arch || cfg.Config.Labels[image.LabelVersion] != version {
				t.Errorf("linux/%s tarball: architecture %s, version label %q", arch, cfg.Architecture, cfg.Config.Labels[image.LabelVersion])
			}
		}
	})

	t.Run("the packaged chart carries the version and installs", func(t *testing.T) {
		pkg, err := loader.Load(filepath.Join(out, chartFile))
		harness.Must(t, err)
		if pkg.Metadata.Version != strings.TrimPrefix(version, "v") || pkg.Metadata.AppVersion != version {
			t.Errorf("chart version %s, appVersion %s", pkg.Metadata.Version, pkg.Metadata.AppVersion)
		}
		env := harness.Clusters(t, 1)
		flags := genericclioptions.NewConfigFlags(false)
		flags.KubeConfig, flags.Context, flags.Namespace = &env.Kubeconfig, &env.Clusters[0].ID, ptr.To(releaseNS)
		cfg := &action.Configuration{}
		harness.Must(t, cfg.Init(flags, releaseNS, "secret", t.Logf))
		install := action.NewInstall(cfg)
		install.ReleaseName, install.Namespace, install.CreateNamespace = release, releaseNS, true
		// The dev apiserver, built from the module proxy without version
		// stamps, reports v0.0.0-master, which the chart's kubeVersion
		// constraint refuses: it is the pinned v1.34.4 (hack/tools/go.mod).
		cfg.Capabilities = chartutil.DefaultCapabilities.Copy()
		cfg.Capabilities.KubeVersion = chartutil.KubeVersion{Version: "v1.34.4", Major: "1", Minor: "34"}
		rel, err := install.RunWithContext(context.Background(), pkg, map[string]any{"region": "us-east-1"})
		harness.Must(t, err)
		if rel.Info.Status != "deployed" {
			t.Errorf("helm install: %s", rel.Info.Status)
		}
		cl := harness.ClientWith(t, env.Clusters[0].Config, nil)
		dep := &appsv1.Deployment{}
		harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: releaseNS, Name: release + "-controller"}, dep))
		if img := dep.Spec.Template.Spec.Containers[0].Image; img != image.Repository+":"+version {
			t.Errorf("the chart's controller image is %s, want %s:%s", img, image.Repository, version)
		}

		// The CRD asset is the packaged chart's CRDs, and applies over
		// them as docs/install.md's upgrade step does.
		var names []string
		for _, c := range pkg.CRDObjects() {
			names = append(names, c.Filename)
		}
		asset, err := os.ReadFile(filepath.Join(out, crdFile))
		harness.Must(t, err)
		if n := strings.Count(string(asset), "\nkind: CustomResourceDefinition\n"); n != len(names) || len(names) != 3 {
			t.Errorf("%s holds %d CRDs, the chart %d (%v)", crdFile, n, len(names), names)
		}
		for _, c := range pkg.CRDObjects() {
			if !strings.Contains(string(asset), strings.TrimSpace(string(c.File.Data))) {
				t.Errorf("%s lacks the chart's %s as it is", crdFile, c.Filename)
			}
		}
		apply := exec.Command(filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.Kubeconfig, "--context", env.Clusters[0].ID,
			"apply", "--server-side", "--force-conflicts", "-f", filepath.Join(out, crdFile))
		if b, err := apply.CombinedOutput(); err != nil {
			t.Errorf("kubectl apply --server-side -f %s: %v\n%s", crdFile, err, b)
		}
	})

	t.Run("the SBOM lists the binary's Go modules", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(out, "clustermap-"+version+".cdx.json"))
		harness.Must(t, err)
		var bom struct {
			BOMFormat  string
			Components []struct{ Name, Version, Purl string }
		}
		harness.Must(t, json.Unmarshal(raw, &bom))
		listed := map[string]string{}
		for _, c := range bom.Components {
			listed[c.Name] = c.Version
		}
		b, err := exec.Command("go", "version", "-m", filepath.Join(out, "clustermap-"+version+"-linux-amd64")).Output()
		harness.Must(t, err)
		deps := 0
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "dep" {
				continue
			}
			deps++
			if listed[f[1]] != f[2] {
				t.Errorf("the SBOM lists %s at %q; the binary has %s", f[1], listed[f[1]], f[2])
			}
		}
		if bom.BOMFormat != "CycloneDX" || deps < 50 {
			t.Errorf("SBOM format %q, %d modules in the binary", bom.BOMFormat, deps)
		}
	})

	t.Run("the notes are the CHANGELOG's section", func(t *testing.T) {
		notes, err := os.ReadFile(filepath.Join(out, "RELEASE_NOTES.md"))
		harness.Must(t, err)
		if !strings.HasPrefix(string(notes), "## "+version+" ") || strings.Contains(string(notes), "## Unreleased") {
			t.Errorf("RELEASE_NOTES.md:\n%s", notes)
		}
	})
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	harness.Must(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		harness.Must(t, err)
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			harness.Must(t, os.MkdirAll(path, 0o755))
			continue
		}
		harness.Must(t, os.MkdirAll(filepath.Dir(path), 0o755))
		data, err := io.ReadAll(tr)
		harness.Must(t, err)
		harness.Must(t, os.WriteFile(path, data, 0o644))
	}
}

// cosignKeyPair makes another key pair, in a directory of its own.
func cosignKeyPair(t *testing.T) (pub, key string, err error) {
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "cosign"), "generate-key-pair")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "COSIGN_PASSWORD=other")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("cosign generate-key-pair: %w\n%s", err, b)
	}
	return filepath.Join(dir, "cosign.pub"), filepath.Join(dir, "cosign.key"), nil
}
