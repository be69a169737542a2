//go:build e2e

package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/image"
)

// The image make image writes, unpacked: its config says how to run it,
// and its binary, static, runs.
func TestImage(t *testing.T) {
	bin := filepath.Join(devenv.BinDir(), "clustermap")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no clustermap binary (make build): %v", err)
	}
	out := t.TempDir()
	platform := "linux/" + runtime.GOARCH
	if err := run("v9.9.9-test", out, []string{platform + "=" + bin}); err != nil {
		t.Fatal(err)
	}

	// The OCI layout: one entry, the index, tagged; one image per platform.
	p, err := layout.FromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations[image.RefName] != "v9.9.9-test" {
		t.Fatalf("index.json should hold the tagged index only: %+v", tm.Manifests)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || image.PlatformString(*im.Manifests[0].Platform) != platform {
		t.Fatalf("want one %s image, got %+v", platform, im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, img, "v9.9.9-test")

	// The docker-load tarball holds the same image under its tag.
	tag, _ := name.NewTag(image.Repository + ":v9.9.9-test")
	timg, err := tarball.ImageFromPath(filepath.Join(out, "clustermap-linux-"+runtime.GOARCH+".tar"), &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := configDigest(t, img), configDigest(t, timg); d1 != d2 {
		t.Errorf("the tarball's image config %s differs from the layout's %s", d2, d1)
	}

	// Unpacked, the binary is static (no interpreter: the image has no
	// libc), executable, and runs.
	root := unpack(t, img)
	ef, err := elf.Open(filepath.Join(root, "clustermap"))
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked; the image needs it static (CGO_ENABLED=0)")
		}
	}
	got, err := exec.Command(filepath.Join(root, "clustermap"), "version").Output()
	if err != nil {
		t.Fatalf("running the unpacked binary: %v", err)
	}
	want, _ := exec.Command(bin, "version").Output()
	if len(got) == 0 || string(got) != string(want) {
		t.Errorf("unpacked binary's version %q, the built one's %q", got, want)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks the nonroot user:\n%s", passwd)
	}
}

func checkConfig(t *testing.T, img v1.Image, version string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if strings.Join(c.Entrypoint, " ") != "/clustermap" {
		t.Errorf("entrypoint %q", c.Entrypoint)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want the non-root 65532:65532", c.User)
	}
	if c.Labels[image.LabelVersion] != version || c.Labels[image.LabelLicenses] != "Apache-2.0" {
		t.Errorf("labels %v", c.Labels)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s", cf.OS, cf.Architecture)
	}
}

func configDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// unpack writes the image's filesystem to a directory.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return root
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode).Perm())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
}
