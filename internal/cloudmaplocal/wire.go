package cloudmaplocal

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/dlclark/regexp2"
)

// Empty is the output of operations that return nothing.
type Empty struct{}

// Timestamp is an AWS JSON 1.1 timestamp: epoch seconds with a fraction.
type Timestamp struct{ time.Time }

func (t Timestamp) MarshalJSON() ([]byte, error) {
	return []byte(strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)), nil
}

func (t *Timestamp) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return err
	}
	sec, frac := math.Modf(f)
	t.Time = time.Unix(int64(sec), int64(frac*1e9)).UTC()
	return nil
}

func ts(t time.Time) *Timestamp { return &Timestamp{t} }

// apiError is an error the wire protocol carries: a model error shape's name
// as __type, its message, and the shape's extra members.
type apiError struct {
	Code    string
	Message string
	Extra   map[string]any
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func errorf(code, format string, args ...any) *apiError {
	return &apiError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Status is the HTTP status the model gives this error; errors outside the
// model (throttling, outages) carry their own.
func (e *apiError) Status() int {
	if s, ok := modelErrors[e.Code]; ok {
		return s
	}
	switch e.Code {
	case "ServiceUnavailable":
		return 503
	case "InternalFailure":
		return 500
	case "MissingAuthenticationTokenException", "UnrecognizedClientException", "InvalidSignatureException":
		return 403
	}
	return 400 // SerializationException, UnknownOperationException
}

type operationSpec struct {
	input  string
	errors []string
	call   func(context.Context, api, []byte) (any, error)
}

type kind int

const (
	kindStructure kind = iota + 1
	kindList
	kindMap
	kindString
	kindNumber
	kindBool
)

type memberSpec struct {
	name     string
	target   string
	required bool
}

type shapeSpec struct {
	kind                 kind
	members              []memberSpec
	elem, key            string
	enum                 []string
	lengthMin, lengthMax *int64
	rangeMin, rangeMax   *int64
	pattern              string
}

func ptr(v int64) *int64 { return &v }

// The Smithy prelude shapes the model refers to.
var preludeShapes = map[string]*shapeSpec{
	"smithy.api#String":    {kind: kindString},
	"smithy.api#Boolean":   {kind: kindBool},
	"smithy.api#Integer":   {kind: kindNumber},
	"smithy.api#Long":      {kind: kindNumber},
	"smithy.api#Timestamp": {kind: kindNumber},
}

func lookupShape(name string) *shapeSpec {
	if s, ok := modelShapes[name]; ok {
		return s
	}
	return preludeShapes[name]
}

var patterns sync.Map // pattern -> func(string) bool

// matchPattern applies a model pattern. The model's patterns are
// ECMAScript; those Go's RE2 compiles (all but ServiceName's lookahead)
// run on it, in linear time: a backtracking match with a timeout failed
// a valid 1,020-character attribute value on a loaded machine, which
// Cloud Map would not.
func matchPattern(p, s string) bool {
	match, ok := patterns.Load(p)
	if !ok {
		var m func(string) bool
		if re, err := regexp.Compile(p); err == nil {
			m = re.MatchString
		} else {
			re := regexp2.MustCompile(p, regexp2.ECMAScript)
			re.MatchTimeout = 10 * time.Second
			m = func(s string) bool {
				ok, err := re.MatchString(s)
				return err == nil && ok
			}
		}
		match, _ = patterns.LoadOrStore(p, m)
	}
	return match.(func(string) bool)(s)
}

// validate checks a decoded request against its input shape the way the
// service does, and reports every violation in the service's words.
func validate(shapeName string, v any) *apiError {
	var problems []string
	check(lookupShape(shapeName), v, "", &problems)
	if len(problems) == 0 {
		return nil
	}
	noun := "errors"
	if len(problems) == 1 {
		noun = "error"
	}
	return errorf("InvalidInput", "%d validation %s detected: %s", len(problems), noun, strings.Join(problems, "; "))
}

func quote(v any) string {
	switch x := v.(type) {
	case string:
		return "'" + x + "'"
	case json.Number:
		return "'" + x.String() + "'"
	}
	return "'" + fmt.Sprint(v) + "'"
}

func check(s *shapeSpec, v any, path string, problems *[]string) {
	if s == nil || v == nil {
		return
	}
	fail := func(c string) {
		*problems = append(*problems, fmt.Sprintf("Value %s at '%s' failed to satisfy constraint: %s", quote(v), path, c))
	}
	switch s.kind {
	case kindStructure:
		obj, ok := v.(map[string]any)
		if !ok {
			fail("Member must be a structure")
			return
		}
		for _, m := range s.members {
			p := lowerFirst(m.name)
			if path != "" {
				p = path + "." + p
			}
			mv, present := obj[m.name]
			if m.required && (!present || mv == nil) {
				*problems = append(*problems, fmt.Sprintf("Value null at '%s' failed to satisfy constraint: Member must not be null", p))
				continue
			}
			check(lookupShape(m.target), mv, p, problems)
		}
	case kindList:
		l, ok := v.([]any)
		if !ok {
			fail("Member must be a list")
			return
		}
		checkLength(s, int64(len(l)), fail)
		for i, e := range l {
			check(lookupShape(s.elem), e, fmt.Sprintf("%s.%d.member", path, i+1), problems)
		}
	case kindMap:
		mp, ok := v.(map[string]any)
		if !ok {
			fail("Member must be a map")
			return
		}
		checkLength(s, int64(len(mp)), fail)
		keys := make([]string, 0, len(mp))
		for k := range mp {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			check(lookupShape(s.key), k, path+".key", problems)
			check(lookupShape(s.elem), mp[k], path+"."+k+".value", problems)
		}
	case kindString:
		str, ok := v.(string)
		if !ok {
			fail("Member must be a string")
			return
		}
		// Lengths count UTF-16 code units, as the service (Java) does.
		checkLength(s, int64(len(utf16.Encode([]rune(str)))), fail)
		if len(s.enum) > 0 && !slices.Contains(s.enum, str) {
			fail("Member must satisfy enum value set: [" + strings.Join(s.enum, ", ") + "]")
		}
		if s.pattern != "" && !matchPattern(s.pattern, str) {
			fail("Member must satisfy regular expression pattern: " + s.pattern)
		}
	case kindNumber:
		n, ok := v.(json.Number)
		if !ok {
			fail("Member must be a number")
			return
		}
		if s.rangeMin == nil && s.rangeMax == nil {
			return
		}
		i, err := n.Int64()
		if err != nil {
			fail("Member must be an integer")
			return
		}
		if s.rangeMin != nil && i < *s.rangeMin {
			fail(fmt.Sprintf("Member must have value greater than or equal to %d", *s.rangeMin))
		}
		if s.rangeMax != nil && i > *s.rangeMax {
			fail(fmt.Sprintf("Member must have value less than or equal to %d", *s.rangeMax))
		}
	case kindBool:
		if _, ok := v.(bool); !ok {
			fail("Member must be a boolean")
		}
	}
}

func checkLength(s *shapeSpec, n int64, fail func(string)) {
	if s.lengthMin != nil && n < *s.lengthMin {
		fail(fmt.Sprintf("Member must have length greater than or equal to %d", *s.lengthMin))
	}
	if s.lengthMax != nil && n > *s.lengthMax {
		fail(fmt.Sprintf("Member must have length less than or equal to %d", *s.lengthMax))
	}
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// decodeInput decodes a validated request body into its wire type.
func decodeInput(body []byte, into any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, into); err != nil {
		return errorf("SerializationException", "could not parse the request: %v", err)
	}
	return nil
}

// Operations lists the operations the emulator serves.
func Operations() []string { return slices.Sorted(maps.Keys(modelOperations)) }
