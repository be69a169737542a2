package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The binary users install holds none of the lab (dev environment, data
// plane, Cloud Map emulator), which lives in binaries of its own.
func TestLinksNoneOfTheLab(t *testing.T) {
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
