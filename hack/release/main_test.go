package main

import (
	"os"
	"path/filepath"
	"regexp"
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

// A release refuses a tree that names another version where users
// install from (the kustomize base pulled v0.1.0 whatever was released).
func TestReleasePinsOneVersion(t *testing.T) {
	if err := samePins("../..", "v0.0.1"); err == nil || !strings.Contains(err.Error(), "config/default/kustomization.yaml names") {
		t.Errorf("the tree against another version: %v", err)
	}
	root := t.TempDir()
	for _, p := range pins {
		data, err := os.ReadFile(filepath.Join("../..", p.file))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p.file)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p.file), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	chart, _ := os.ReadFile(filepath.Join(root, "charts/clustermap/Chart.yaml"))
	version := regexp.MustCompile(`(?m)^appVersion: "?(v[^"\s]+)"?$`).FindSubmatch(chart)
	if version == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	if err := samePins(root, string(version[1])); err != nil {
		t.Fatalf("the tree as it is: %v", err)
	}
	dns := filepath.Join(root, "config/dns/dns.yaml")
	data, _ := os.ReadFile(dns)
	if err := os.WriteFile(dns, []byte(strings.ReplaceAll(string(data), string(version[1]), "v9.9.9")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := samePins(root, string(version[1])); err == nil || !strings.Contains(err.Error(), "config/dns/dns.yaml names v9.9.9") {
		t.Errorf("a stale config/dns: %v", err)
	}
}
