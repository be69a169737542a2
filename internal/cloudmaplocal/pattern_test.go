package cloudmaplocal

import (
	"regexp"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// Every model pattern gives matchPattern's verdict as the ECMAScript
// engine gives it, on values of every kind the patterns see, the longest
// attribute values too (a change record packs 1,020 characters of
// "<seq> <namespace>/<name>," into one).
func TestPatternsMatchAsECMAScript(t *testing.T) {
	packed := strings.Repeat("67 team-28/svc-0068,", 51)[:1019]
	samples := []string{"", "a", "ns", "my-namespace.local", ".", "a..b", "-a", "arn:aws:x", "srv-abc123", "10.0.0.1", "fd00::1",
		"tcp-10_0_0_1-8080", "with space", " leading", "trailing ", "tab\there", "new\nline", "non-ascii é", "x_y", "a/b:c@d.e-f",
		packed, packed + "\n", strings.Repeat("a", 1024), strings.Repeat("a", 64) + "." + strings.Repeat("b", 63)}
	re2 := 0
	for name, s := range modelShapes {
		if s.pattern == "" {
			continue
		}
		if _, err := regexp.Compile(s.pattern); err == nil {
			re2++
		}
		ecma := regexp2.MustCompile(s.pattern, regexp2.ECMAScript)
		for _, v := range samples {
			want, err := ecma.MatchString(v)
			if err != nil {
				t.Fatal(err)
			}
			if got := matchPattern(s.pattern, v); got != want {
				t.Errorf("%s %q on %.40q: %v, the ECMAScript engine says %v", name, s.pattern, v, got, want)
			}
		}
	}
	if re2 == 0 {
		t.Error("no model pattern runs on RE2")
	}
	if !matchPattern(modelShapes["AttrValue"].pattern, packed) {
		t.Error("a packed change record's value is refused")
	}
}
