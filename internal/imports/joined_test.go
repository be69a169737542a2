package imports

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/registry"
)

// A cluster that starts exporting a Service already imported here, with a
// ServiceExport it claims was created in 2020 and of another type, wins no
// conflict: its creation time counts from when it joined, also after a
// restart of this controller. The clusters exporting when the import was
// made keep their own times.
func TestBackdatedNewcomerWinsNoConflict(t *testing.T) {
	c := importClient()
	gate := &clusterid.Gate{}
	gate.Open(clusterid.Identity{ClusterID: "c9", ClusterSet: "set"}, nil)
	key := registry.Key{Namespace: "ns", Name: "web"}
	established := exportWith("c1", mcsv1beta1.ClusterSetIP, "10.0.0.1")
	established.Created = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	newcomer := exportWith("c2", mcsv1beta1.Headless, "10.0.1.1")
	newcomer.Created = time.Date(2020, 1, 2, 0, 0, 0, 0, time.UTC)

	pass := func(exports ...registry.Export) *mcsv1beta1.ServiceImport {
		t.Helper()
		view := NewView() // a new controller each pass: what it knows is on the import
		view.Synced()
		view.Set(key, exports)
		return reconciled(t, &Reconciler{Client: c, Gate: gate, View: view, Recorder: record.NewFakeRecorder(100), Namespaces: func(string) bool { return true }}, key)
	}
	if si := pass(established); si.Spec.Type != mcsv1beta1.ClusterSetIP {
		t.Fatalf("import type %s, want ClusterSetIP", si.Spec.Type)
	}
	for i := range 2 {
		si := pass(established, newcomer)
		if si.Spec.Type != mcsv1beta1.ClusterSetIP || len(si.Status.Clusters) != 2 {
			t.Fatalf("pass %d with the backdated newcomer: type %s, clusters %v; want ClusterSetIP from both (annotation %s)", i, si.Spec.Type, si.Status.Clusters, si.Annotations[JoinedAnnotation])
		}
	}
	derived := &corev1.Service{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: DerivedName("web")}, derived); err != nil {
		t.Errorf("the derived Service (the clusterset VIP) is gone: %v", err)
	}

	// Once the newcomer stops exporting, it is forgotten; the clusters
	// of a new import are all taken at their word.
	pass(established)
	c = importClient()
	if si := pass(established, newcomer); si.Spec.Type != mcsv1beta1.Headless {
		t.Errorf("a new import of both: type %s, want the older export's Headless", si.Spec.Type)
	}
}

func TestJoinedExporters(t *testing.T) {
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	old := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	joined := now.Add(-time.Hour)
	e := func(c string) registry.Export { return registry.Export{Cluster: c, Created: old} }
	withStatus := func(annotation string, clusters ...string) *mcsv1beta1.ServiceImport {
		si := &mcsv1beta1.ServiceImport{}
		if annotation != "" {
			si.Annotations = map[string]string{JoinedAnnotation: annotation}
		}
		for _, c := range clusters {
			si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
		}
		return si
	}
	// The gap between exports made at about the same time stands.
	close := e("c")
	close.Created = now.Add(-joinGrace + time.Minute)
	if out, _ := joinedExporters(withStatus("", "a"), []registry.Export{close}, true, now); !out[0].Created.Equal(close.Created) {
		t.Errorf("an export made %v before its cluster joined became %v", joinGrace-time.Minute, out[0].Created)
	}
	for _, tc := range []struct {
		name    string
		have    *mcsv1beta1.ServiceImport
		synced  bool
		want    string
		clamped []string
	}{
		{"a new import trusts all", nil, true, `{"a":0,"b":0}`, nil},
		{"an import from before the annotation trusts its clusters", withStatus("", "a"), true, `{"a":0,"b":` + ms(now) + `}`, []string{"b"}},
		{"an import with no cluster said proves no one new", withStatus(""), true, `{"a":0,"b":0}`, nil},
		{"a joined cluster stays clamped", withStatus(`{"a":0,"b":`+ms(joined)+`}`, "a", "b"), true, `{"a":0,"b":` + ms(joined) + `}`, []string{"b"}},
		{"a cluster gone is forgotten once synced", withStatus(`{"a":0,"c":7}`, "a", "c"), true, `{"a":0,"b":` + ms(now) + `}`, []string{"b"}},
		{"and kept before", withStatus(`{"a":0,"c":7}`, "a", "c"), false, `{"a":0,"b":` + ms(now) + `,"c":7}`, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, got := joinedExporters(tc.have, []registry.Export{e("a"), e("b")}, tc.synced, now)
			if got != tc.want {
				t.Errorf("annotation %s, want %s", got, tc.want)
			}
			for _, x := range out {
				clamped := !x.Created.Equal(old)
				want := false
				for _, c := range tc.clamped {
					want = want || c == x.Cluster
				}
				if clamped != want {
					t.Errorf("%s created %v: clamped %v, want %v", x.Cluster, x.Created, clamped, want)
				}
			}
		})
	}
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
