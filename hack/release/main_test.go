package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReleaseNotesAreTheVersionsSection(t *testing.T) {
	file := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(file, []byte("# Changelog\n\n## Unreleased\n- next\n\n## v1.2.0 - 2026-11-25\n- this\n\n## v1.1.0 - 2026-10-01\n- older\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notes, err := releaseNotes(file, "v1.2.0")
	if err != nil || notes != "## v1.2.0 - 2026-11-25\n- this\n" {
		t.Errorf("notes %q, %v", notes, err)
	}
	if _, err := releaseNotes(file, "v1.3.0"); err == nil || !strings.Contains(err.Error(), "## v1.3.0") {
		t.Errorf("a version without a section: %v", err)
	}
}

func TestVersionsAreSemver(t *testing.T) {
	for v, ok := range map[string]bool{"v1.2.3": true, "v0.1.0-rc.1": true, "1.2.3": false, "v1.2": false, "v01.2.3": false, "latest": false} {
		if semver.MatchString(v) != ok {
			t.Errorf("%s: valid=%v, want %v", v, !ok, ok)
		}
	}
	if err := run("v1.2", t.TempDir(), "bin"); err == nil || !strings.Contains(err.Error(), "vMAJOR.MINOR.PATCH") {
		t.Errorf("a bad version: %v", err)
	}
}
