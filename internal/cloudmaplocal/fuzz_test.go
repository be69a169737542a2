package cloudmaplocal

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The emulator decodes whatever a client sends: any body for any
// operation gets a JSON answer, 200 or a 4xx/5xx error with a __type,
// never a panic.
func FuzzRequest(f *testing.F) {
	for _, seed := range []struct{ op, body string }{
		{"CreateHttpNamespace", `{"Name":"ns","CreatorRequestId":"x"}`},
		{"RegisterInstance", `{"ServiceId":"srv-1","InstanceId":"i","Attributes":{"AWS_INSTANCE_IPV4":"10.0.0.1"}}`},
		{"ListOperations", `{"Filters":[{"Name":"UPDATE_DATE","Condition":"BETWEEN","Values":["1","2"]}]}`},
		{"DiscoverInstances", `{"NamespaceName":"ns","ServiceName":"s","QueryParameters":{"a":"b"},"MaxResults":1}`},
		{"ListServices", `{"MaxResults":-1,"NextToken":"%%%"}`},
		{"GetOperation", `[]`},
	} {
		f.Add(seed.op, seed.body)
	}
	f.Fuzz(func(t *testing.T, op, body string) {
		srv, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		// The namespace and service the seeds name exist, so that deeper
		// paths are reached too.
		do(srv, "CreateHttpNamespace", `{"Name":"ns"}`)
		do(srv, "CreateService", `{"Name":"s","NamespaceId":"ns-1"}`)
		code, out := do(srv, op, body)
		if code != http.StatusOK && (code < 400 || code > 599) {
			t.Fatalf("%s %q: status %d", op, body, code)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%s %q: answer %q is not a JSON object: %v", op, body, out, err)
		}
		if code != http.StatusOK && v["__type"] == nil {
			t.Fatalf("%s %q: error %d without __type: %s", op, body, code, out)
		}
	})
}

func do(srv *Server, op, body string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	req.Header.Set("X-Amz-Target", targetPrefix+op)
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}
