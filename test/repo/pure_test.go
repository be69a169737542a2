package repo

import (
	"os/exec"
	"strings"
	"testing"
)

// The pure packages compute, and do no I/O: the record format is read and
// written by the Cloud Map adapter, never by itself, so it imports no AWS
// SDK nor Kubernetes client, and can be fuzzed and reasoned about alone.
func TestPurePackagesImportNoSDK(t *testing.T) {
	for _, pkg := range []string{"../../internal/registry/cloudmap/recordfmt"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/aws/") || strings.HasPrefix(dep, "k8s.io/client-go") {
				t.Errorf("%s imports %s: keep the record format pure (the adapter in package cloudmap does the I/O)", pkg, dep)
			}
		}
	}
}
