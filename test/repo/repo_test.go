// Package repo holds checks of what the repository tracks.
package repo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTracked is the largest file the repository may track: sources and
// test data stay far below it; a compiled binary does not.
const maxTracked = 1 << 20

// binaryMagic are the first bytes of executables and archives (ELF,
// Mach-O both ways and fat, PE, ar, gzip, zip).
var binaryMagic = [][]byte{
	[]byte("\x7fELF"), {0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, {0xce, 0xfa, 0xed, 0xfe},
	{0xcf, 0xfa, 0xed, 0xfe}, {0xca, 0xfe, 0xba, 0xbe}, []byte("MZ"), []byte("!<arch>\n"), {0x1f, 0x8b}, []byte("PK\x03\x04"),
}

// Nothing built is tracked: no file over 1 MB, no compiled executable or
// archive, and no file marked executable that is not a script (a
// committed binary, twice a 23 MB one at the root, bloats every clone).
func TestNothingBuiltIsTracked(t *testing.T) {
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git: %v (the check reads the tracked files from git)", err)
	}
	dir := strings.TrimSpace(string(root))
	out, err := exec.Command("git", "-C", dir, "ls-files", "-s", "-z").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		meta, path, _ := strings.Cut(entry, "\t")
		mode := strings.Fields(meta)[0]
		if mode == "120000" || mode == "160000" {
			continue // a symlink or submodule
		}
		data, err := os.ReadFile(filepath.Join(dir, path))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not committed yet
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > maxTracked {
			t.Errorf("%s is tracked and %d bytes (over %d): build outputs go under bin/ or dist/", path, len(data), maxTracked)
		}
		for _, m := range binaryMagic {
			if bytes.HasPrefix(data, m) {
				t.Errorf("%s is tracked and is a compiled binary or archive: build outputs go under bin/ or dist/", path)
			}
		}
		if mode == "100755" && !bytes.HasPrefix(data, []byte("#!")) {
			t.Errorf("%s is tracked as executable and is no script", path)
		}
	}
}
