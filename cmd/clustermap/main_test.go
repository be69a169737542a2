package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The binary users install builds for every platform a user's laptop or
// cluster runs, and holds none of the lab (dev environment, data plane,
// Cloud Map emulator), which lives in binaries of its own.
func TestBuildsForEveryPlatformWithoutTheLab(t *testing.T) {
	deps, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, lab := range []string{"/internal/devenv", "/internal/cloudmaplocal", "/test/"} {
		for _, d := range strings.Fields(string(deps)) {
			if strings.Contains(d, "github.com/clustermap/clustermap"+lab) {
				t.Errorf("clustermap links %s, part of the lab", d)
			}
		}
	}
	out := t.TempDir()
	for _, platform := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"} {
		goos, goarch, _ := strings.Cut(platform, "/")
		bin := filepath.Join(out, goos+"-"+goarch)
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
		if o, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("building for %s: %v\n%s", platform, err, o)
			continue
		}
		if fi, err := os.Stat(bin); err != nil || fi.Size() == 0 {
			t.Errorf("building for %s wrote no binary: %v", platform, err)
		}
	}
}

func TestVersion(t *testing.T) {
	root := newRoot()
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil || !strings.HasPrefix(out.String(), "clustermap ") {
		t.Fatalf("version: %q %v", out.String(), err)
	}
}
