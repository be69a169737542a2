package repo

import (
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// workflow is the part of a GitHub Actions workflow the check reads.
type workflow struct {
	Jobs map[string]struct {
		Needs       any
		Permissions map[string]string
		Steps       []struct {
			Name, Uses, Run string
			With            map[string]any
		}
	}
}

// The release workflow publishes nothing the test suite has not passed on,
// signs what it publishes (image, chart, checksums), attests provenance,
// and fails when what it pushed cannot be pulled anonymously. The workflow
// runs only on GitHub: this holds its shape.
func TestReleaseWorkflow(t *testing.T) {
	raw, err := os.ReadFile("../../.github/workflows/release.yml")
	if err != nil {
		t.Fatal(err)
	}
	var w workflow
	if err := yaml.Unmarshal(raw, &w); err != nil {
		t.Fatal(err)
	}
	test, release := w.Jobs["test"], w.Jobs["release"]
	runs := func(steps []struct {
		Name, Uses, Run string
		With            map[string]any
	}, what string) int {
		for i, s := range steps {
			if strings.Contains(s.Run, what) || strings.Contains(s.Uses, what) {
				return i
			}
		}
		return -1
	}
	if runs(test.Steps, ".ci/run") < 0 {
		t.Error("the test job does not run .ci/run (make tools, make test)")
	}
	if needs := release.Needs; needs != "test" && !slices.Contains(asStrings(needs), "test") {
		t.Errorf("the release job needs %v, want the test job", needs)
	}
	if release.Permissions["id-token"] != "write" || release.Permissions["attestations"] != "write" {
		t.Errorf("release permissions %v: keyless signing and provenance need id-token and attestations write", release.Permissions)
	}
	push, ghRelease := runs(release.Steps, "crane push"), runs(release.Steps, "gh release create")
	order := []struct {
		what string
		at   int
	}{
		{"cosign sign --yes \"$IMAGE@", runs(release.Steps, "cosign sign --yes \"$IMAGE@")},
		{"cosign sign of the chart", runs(release.Steps, "ghcr.io/clustermap/charts/clustermap@")},
		{"cosign sign-blob of SHA256SUMS", runs(release.Steps, "cosign sign-blob --yes --bundle dist/SHA256SUMS.sigstore.json dist/SHA256SUMS")},
		{"build provenance", runs(release.Steps, "actions/attest-build-provenance")},
		{"an anonymous pull", runs(release.Steps, "DOCKER_CONFIG=\"$(mktemp -d)\"")},
	}
	for _, o := range order {
		if o.at < 0 || o.at < push || o.at > ghRelease {
			t.Errorf("%s: step %d, want it after the push (step %d) and before the GitHub release (step %d)", o.what, o.at, push, ghRelease)
		}
	}
}

func asStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, s := range l {
			if s, ok := s.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}
