//go:build e2e

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The binary users install builds for every platform a user's laptop or
// cluster runs (cold, the four builds take minutes: with the slow tests).
func TestBuildsForEveryPlatform(t *testing.T) {
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
