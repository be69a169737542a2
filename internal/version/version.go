// Package version reports the build's version, set by the Makefile's ldflags.
package version

import (
	"fmt"
	"runtime"
)

// Version is overwritten at link time with `git describe`.
var Version = "dev"

// String is the one-line version report of `clustermap version`.
func String() string {
	return fmt.Sprintf("clustermap %s (%s, %s/%s)", Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
