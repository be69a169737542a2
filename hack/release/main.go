// Command release writes everything a release publishes into one
// directory (make release VERSION=vX.Y.Z):
//
//   - clustermap-<version>-<os>-<arch>: the CLI (and controller) for linux
//     and darwin on amd64 and arm64, static;
//   - clustermap-<version>-oci.tar: the multi-platform image as an OCI
//     archive (skopeo copy oci-archive:..., crane push), tagged <version>;
//     clustermap-<version>-image-linux-<arch>.tar: docker load tarballs;
//   - clustermap-<chart version>.tgz: the chart, appVersion and default
//     image tag <version>;
//   - clustermap-<version>-crds.yaml: the chart's CRDs alone, for kubectl
//     apply --server-side before an upgrade and for GitOps tools that
//     manage CRDs apart from the chart;
//   - clustermap-<version>.cdx.json: the CycloneDX SBOM of the binary's Go
//     modules, by cyclonedx-gomod;
//   - RELEASE_NOTES.md: the version's CHANGELOG.md section;
//   - SHA256SUMS: of every file above, for sha256sum -c;
//   - SHA256SUMS.sigstore.json: with COSIGN_KEY set (a cosign key file,
//     its password in COSIGN_PASSWORD), SHA256SUMS signed with that key (the
//     release workflow signs keyless instead).
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/clustermap/clustermap/internal/image"
)

func main() {
	version := flag.String("version", "", "the release: vMAJOR.MINOR.PATCH, with an optional -prerelease")
	out := flag.String("out", "", "output directory (emptied first)")
	tools := flag.String("tools", "bin", "directory of the pinned tools (cyclonedx-gomod)")
	flag.Parse()
	if err := run(*version, *out, *tools); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// Platforms the CLI is built for; the image takes the linux ones.
var Platforms = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"}

var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

func run(version, out, tools string) error {
	if !semver.MatchString(version) {
		return fmt.Errorf("VERSION=%q: want vMAJOR.MINOR.PATCH (v1.2.3, v1.3.0-rc.1)", version)
	}
	if out == "" {
		return errors.New("no output directory")
	}
	notes, err := releaseNotes("CHANGELOG.md", version)
	if err != nil {
		return err
	}
	if err := samePins(".", version); err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var bins []image.Binary
	for _, p := range Platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		file := filepath.Join(out, fmt.Sprintf("clustermap-%s-%s-%s", version, goos, goarch))
		fmt.Println("release: building", file)
		if err := build(file, goos, goarch, version); err != nil {
			return err
		}
		if goos == "linux" {
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			plat, err := image.ParsePlatform(p)
			if err != nil {
				return err
			}
			bins = append(bins, image.Binary{Platform: plat, Data: data})
		}
	}
	if err := images(out, version, bins); err != nil {
		return err
	}
	if err := packageChart(out, version); err != nil {
		return err
	}
	if err := crdAsset(filepath.Join(out, "clustermap-"+version+"-crds.yaml")); err != nil {
		return err
	}
	// The SBOM of the shipped binary (its embedded module list): every
	// platform's build has the same modules.
	fmt.Println("release: SBOM")
	sbom := exec.Command(filepath.Join(tools, "cyclonedx-gomod"), "bin", "-json", "-version", version,
		"-output", filepath.Join(out, "clustermap-"+version+".cdx.json"), filepath.Join(out, fmt.Sprintf("clustermap-%s-linux-amd64", version)))
	if b, err := sbom.CombinedOutput(); err != nil {
		return fmt.Errorf("cyclonedx-gomod (make tools builds it): %w\n%s", err, b)
	}
	if err := os.WriteFile(filepath.Join(out, "RELEASE_NOTES.md"), []byte(notes), 0o644); err != nil {
		return err
	}
	if err := checksums(out); err != nil {
		return err
	}
	if key := os.Getenv("COSIGN_KEY"); key != "" {
		fmt.Println("release: signing SHA256SUMS with", key)
		sign := exec.Command(filepath.Join(tools, "cosign"), "sign-blob", "--yes", "--key", key, "--tlog-upload=false",
			"--bundle", filepath.Join(out, "SHA256SUMS.sigstore.json"), filepath.Join(out, "SHA256SUMS"))
		if b, err := sign.CombinedOutput(); err != nil {
			return fmt.Errorf("cosign sign-blob (make tools builds it): %w\n%s", err, b)
		}
	}
	return nil
}

// build compiles clustermap as make build does, for one platform.
func build(file, goos, goarch, version string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/clustermap/clustermap/internal/version.Version="+version,
		"-o", file, "./cmd/clustermap")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// images writes the OCI archive of the index and the docker-load tarballs.
func images(out, version string, bins []image.Binary) error {
	tmp, err := os.MkdirTemp("", "clustermap-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	files, err := image.Write(tmp, version, bins)
	if err != nil {
		return err
	}
	for _, f := range files {
		if filepath.Base(f) == "oci" {
			if err := tarDir(f, filepath.Join(out, "clustermap-"+version+"-oci.tar")); err != nil {
				return err
			}
			continue
		}
		arch := strings.TrimPrefix(strings.TrimSuffix(filepath.Base(f), ".tar"), "clustermap-")
		if err := os.Rename(f, filepath.Join(out, "clustermap-"+version+"-image-"+arch+".tar")); err != nil {
			return err
		}
	}
	return nil
}

// tarDir writes dir's files, relative to it, as a tar: an OCI archive is
// a tar of an OCI layout.
func tarDir(dir, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// packageChart writes the chart with the release's versions: chart
// version without the v, appVersion (the default image tag) with it.
func packageChart(out, version string) error {
	ch, err := loader.Load("charts/clustermap")
	if err != nil {
		return err
	}
	ch.Metadata.Version = strings.TrimPrefix(version, "v")
	ch.Metadata.AppVersion = version
	if err := ch.Validate(); err != nil {
		return err
	}
	file, err := chartutil.Save(ch, out)
	if err == nil {
		fmt.Println("release: chart", file)
	}
	return err
}

// crdAsset writes the chart's CRDs as one YAML stream, in name order.
func crdAsset(file string) error {
	paths, err := filepath.Glob("charts/clustermap/crds/*.yaml")
	if err != nil || len(paths) == 0 {
		return fmt.Errorf("the chart's CRDs (charts/clustermap/crds): %v", err)
	}
	slices.Sort(paths)
	var docs []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		docs = append(docs, strings.TrimPrefix(strings.TrimSpace(string(b)), "---\n"))
	}
	return os.WriteFile(file, []byte("---\n"+strings.Join(docs, "\n---\n")+"\n"), 0o644)
}

// pins are where the tree names the version it is cut for: what users
// install from it besides the packaged chart (whose versions are set
// here), each a pattern whose first group is the version.
var pins = []struct{ file, pattern string }{
	{"charts/clustermap/Chart.yaml", `(?m)^appVersion: "?(v[^"\s]+)"?$`},
	{"config/default/kustomization.yaml", `(?m)^\s*newTag: (v\S+)$`},
	{"config/dns/dns.yaml", `image: ghcr\.io/clustermap/clustermap:(v\S+)`},
	{"docs/install.md", `(?m)^v=(v\S+)`},
	{"docs/install.md", `--version (\S+) `},
	{"docs/install.md", `\?ref=(v[^'"\s]+)`},
}

// samePins refuses a release whose tree (under root) names another
// version anywhere a user installs from: a kustomize base or document
// pinned to the last release would install that one.
func samePins(root, version string) error {
	var wrong []string
	for _, p := range pins {
		data, err := os.ReadFile(filepath.Join(root, p.file))
		if err != nil {
			return err
		}
		found := regexp.MustCompile(p.pattern).FindAllStringSubmatch(string(data), -1)
		if len(found) == 0 {
			wrong = append(wrong, fmt.Sprintf("%s names no version where %s should match", p.file, p.pattern))
		}
		for _, m := range found {
			if m[1] != version && m[1] != strings.TrimPrefix(version, "v") {
				wrong = append(wrong, fmt.Sprintf("%s names %s", p.file, m[1]))
			}
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("the tree is not cut for %s: %s (set each to %s, then release)", version, strings.Join(wrong, "; "), version)
	}
	return nil
}

// releaseNotes is the CHANGELOG section of version ("## vX.Y.Z ..." up to
// the next "## ").
func releaseNotes(changelog, version string) (string, error) {
	data, err := os.ReadFile(changelog)
	if err != nil {
		return "", err
	}
	var section []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			heading := strings.Fields(strings.TrimPrefix(line, "## "))
			in = len(heading) > 0 && heading[0] == version
		}
		if in {
			section = append(section, line)
		}
	}
	if len(section) == 0 {
		return "", fmt.Errorf("CHANGELOG.md has no section for %s: add one (\"## %s - YYYY-MM-DD\") before releasing", version, version)
	}
	return strings.TrimSpace(strings.Join(section, "\n")) + "\n", nil
}

// checksums writes SHA256SUMS of every file in out, in sha256sum's format.
func checksums(out string) error {
	entries, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	var lines []string
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "SHA256SUMS" {
			continue
		}
		sum, err := fileSHA256(filepath.Join(out, e.Name()))
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+e.Name())
	}
	slices.Sort(lines)
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
