package repo

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink  = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlID  = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
)

// Every relative link of the repository's Markdown names a file that
// exists and, with an anchor, a heading of it, as GitHub renders them:
// documents moved between the README and docs/ must not leave a reader
// at a dead link.
func TestDocLinksResolve(t *testing.T) {
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git: %v (the check reads the tracked files from git)", err)
	}
	dir := strings.TrimSpace(string(root))
	out, err := exec.Command("git", "-C", dir, "ls-files", "--cached", "--others", "--exclude-standard", "*.md").Output()
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := map[string]bool{}
		for _, h := range headings(string(data)) {
			slug := slugOf(h)
			for n := 1; a[slug]; n++ { // GitHub numbers repeated headings
				slug = slugOf(h) + "-" + strconv.Itoa(n)
			}
			a[slug] = true
		}
		for _, m := range htmlID.FindAllStringSubmatch(string(data), -1) {
			a[m[1]] = true
		}
		anchors[path] = a
		return a
	}
	checked := 0
	for _, rel := range strings.Fields(string(out)) {
		if strings.Contains(rel, "testdata/") {
			continue
		}
		path := filepath.Join(dir, rel)
		data, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range prose(string(data)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := path
				if file != "" {
					dest = filepath.Join(filepath.Dir(path), file)
				}
				checked++
				st, err := os.Stat(dest)
				if err != nil {
					t.Errorf("%s: link %s: %s does not exist", rel, target, file)
					continue
				}
				if anchor != "" && !st.IsDir() && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s: link %s: %s has no heading #%s", rel, target, file, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links found: the pattern no longer reads the documents", checked)
	}
}

// prose is a document's lines outside fenced code blocks.
func prose(doc string) []string {
	var lines []string
	fenced := false
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines = append(lines, l)
		}
	}
	return lines
}

func headings(doc string) []string {
	var hs []string
	for _, l := range prose(doc) {
		if m := heading.FindStringSubmatch(l); m != nil {
			hs = append(hs, m[1])
		}
	}
	return hs
}

// slugOf is GitHub's anchor for a heading: lower case, letters, digits,
// hyphens and underscores kept, spaces made hyphens, the rest dropped.
func slugOf(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
