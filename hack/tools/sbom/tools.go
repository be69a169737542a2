//go:build tools

// The commands built from this module (hack/build-tools.sh).
package tools

import _ "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"
