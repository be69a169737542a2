//go:build linux

package devenv

import (
	"os"
	"path/filepath"
)

// BinDir finds the pinned tools: $CLUSTERMAP_BIN_DIR, else ./bin of the
// checkout holding the working directory.
func BinDir() string {
	if d := os.Getenv("CLUSTERMAP_BIN_DIR"); d != "" {
		return d
	}
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "go.mod")); err == nil {
			return filepath.Join(dir, "bin")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "bin"
		}
		dir = parent
	}
}
