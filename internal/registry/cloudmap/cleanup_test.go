package cloudmap

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
)

// A withdrawal's cleanup reads InstanceCount, then lists the records: what
// the listing shows decides, as the count may have changed in between.
// Before, a count of one read just before our deregistration finished,
// then a listing of none of ours, was taken for others' records: the
// emptied service stayed (TestRecordGoesWithTheLastExport failed so in a
// clean-clone run).
func TestCleanupDecidesOnTheListing(t *testing.T) {
	ours := map[string]string{"CLUSTER_ID": "c1", "CLUSTERSET_ID": "set"}
	theirs := map[string]string{"CLUSTER_ID": "c2", "CLUSTERSET_ID": "set"}
	for _, tc := range []struct {
		name      string
		listed    []map[string]string
		want      error
		deleteSvc bool
	}{
		{"our deregistration runs", []map[string]string{theirs, ours}, ErrPending, false},
		{"others' records remain", []map[string]string{theirs}, nil, false},
		{"emptied since the count", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-amz-json-1.1")
				op := r.Header.Get("X-Amz-Target")[len("Route53AutoNaming_v20170314."):]
				mu.Lock()
				calls = append(calls, op)
				mu.Unlock()
				var out any
				switch op {
				case "GetService":
					out = map[string]any{"Service": map[string]any{"Id": "srv-1", "NamespaceId": "ns-1", "InstanceCount": 1}}
				case "ListInstances":
					var in []map[string]any
					for i, attrs := range tc.listed {
						in = append(in, map[string]any{"Id": string(rune('a' + i)), "Attributes": attrs})
					}
					out = map[string]any{"Instances": in}
				case "DeleteService":
					out = map[string]any{}
				case "GetNamespace": // another service is left in it: the namespace stays
					out = map[string]any{"Namespace": map[string]any{"Id": "ns-1", "ServiceCount": 1}}
				default:
					http.Error(w, "not scripted", http.StatusBadRequest)
					return
				}
				_ = json.NewEncoder(w).Encode(out)
			}))
			defer srv.Close()
			b := New(cloudmaptest.ClientOf(t, srv.URL, cloudmapclient.Options{}), Options{Cluster: "c1", ClusterSet: "set", Log: logr.Discard()})
			b.created["srv-1"] = true
			err := b.cleanup(context.Background(), registry.Key{Namespace: "apps", Name: "web"}, "srv-1")
			if !errors.Is(err, tc.want) {
				t.Errorf("cleanup: %v, want %v", err, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if deleted := slices.Contains(calls, "DeleteService"); deleted != tc.deleteSvc {
				t.Errorf("the service deleted: %v, want %v (calls %v)", deleted, tc.deleteSvc, calls)
			}
		})
	}
}
