package clusterstatus

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/statuslease"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func lease(renew time.Time, ann map[string]string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: ann},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("pod-a"), RenewTime: ptr.To(metav1.NewMicroTime(renew))}}
}

func TestSummarizeStuck(t *testing.T) {
	deleting := func(ago time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(-ago))) }
	for _, c := range []struct {
		what string
		read Read
		want []string // substrings of the stuck lines, in order
	}{
		{"all well", Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now.Add(-30*time.Second), map[string]string{statuslease.AnnotationLastSync: now.Format(time.RFC3339)})}, nil},
		{"no identity, no controller", Read{}, []string{"cluster identity not set", "no controller status"}},
		{"silent controller", Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now.Add(-10*time.Minute), nil)}, []string{"controller silent"}},
		{"registry and peer down", Read{ClusterID: "c1", ClusterSet: "set",
			Lease: lease(now, map[string]string{statuslease.AnnotationCloudMapErr: "RequestLimitExceeded", statuslease.AnnotationPeersDown: "cluster-2"})},
			[]string{"Cloud Map unreachable: RequestLimitExceeded", "peer unreachable: cluster-2"}},
		{"the hub down", Read{ClusterID: "c1", ClusterSet: "set",
			Lease: lease(now, map[string]string{statuslease.AnnotationCloudMapErr: "connection refused", statuslease.AnnotationSources: `{"` + statuslease.HubSource + `":{"error":"connection refused"}}`})},
			[]string{"the hub unreachable: connection refused"}},
		{"a finalizer pending for long, another for a moment", Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now, nil),
			Exports: []mcsv1beta1.ServiceExport{
				{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "old", DeletionTimestamp: deleting(5 * time.Minute), Finalizers: []string{"clustermap.io/export"}}},
				{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "new", DeletionTimestamp: deleting(5 * time.Second), Finalizers: []string{"clustermap.io/export"}}},
			}}, []string{"ServiceExport a/old: deletion waiting on finalizers clustermap.io/export"}},
		{"a domain conflict", Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now, nil),
			Services: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api"}, Status: corev1.ServiceStatus{Conditions: []metav1.Condition{
				{Type: cloudmapdns.ConditionRegistered, Status: metav1.ConditionFalse, Reason: cloudmapdns.ReasonDomainConflict, Message: "web2/api holds api.ecs.local"}}}}}},
			[]string{"Service web/api: DomainConflict: web2/api holds api.ecs.local"}},
		{"a cluster drained, another alive", Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now, map[string]string{statuslease.AnnotationProofs: `{"c2":{"last":"2026-11-22T11:00:00Z","drained":true},"c3":{"last":"2026-11-22T11:55:00Z"}}`})},
			[]string{"cluster c2 drained: no proof of life since 2026-11-22T11:00:00Z (1h0m0s ago)"}},
	} {
		got := Summarize(c.read, now).Stuck
		if len(got) != len(c.want) {
			t.Errorf("%s: stuck %q, want %d lines like %q", c.what, got, len(c.want), c.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], c.want[i]) {
				t.Errorf("%s: line %d %q, want it to say %q", c.what, i, got[i], c.want[i])
			}
		}
	}
}

func TestSummarizeImports(t *testing.T) {
	ready := func(b bool) discoveryv1.EndpointConditions { return discoveryv1.EndpointConditions{Ready: &b} }
	r := Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now, nil),
		Imports: []mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api"},
			Spec:   mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.201.0.9", "fd00:10:201::9"}},
			Status: mcsv1beta1.ServiceImportStatus{Clusters: []mcsv1beta1.ClusterStatus{{Cluster: "cluster-1"}, {Cluster: "cluster-2"}}}}},
		Slices: []discoveryv1.EndpointSlice{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Labels: map[string]string{mcsv1beta1.LabelServiceName: "api"}}, AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.101.0.2"}, Conditions: ready(true)}, {Addresses: []string{"10.101.0.3"}, Conditions: ready(false)}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Labels: map[string]string{mcsv1beta1.LabelServiceName: "api"}}, AddressType: discoveryv1.AddressTypeIPv6,
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00:10:101::2"}, Conditions: ready(true)}}},
		}}
	c := Summarize(r, now)
	if len(c.Imports) != 1 {
		t.Fatalf("imports %+v", c.Imports)
	}
	im := c.Imports[0]
	if strings.Join(im.Clusters, ",") != "cluster-1,cluster-2" || im.Ready["IPv4"] != 1 || im.Ready["IPv6"] != 1 || families(im.Ready) != "IPv4:1 IPv6:1" {
		t.Errorf("import %+v", im)
	}
}

func TestSummarizeWhereTheControllerReports(t *testing.T) {
	elsewhere := lease(now, nil)
	elsewhere.Namespace = "platform"
	other := lease(now, nil)
	other.Namespace = "team-b"
	for _, c := range []struct {
		what        string
		read        Read
		stuck, note string
	}{
		{"namespace missing, no Lease anywhere", Read{StatusNamespace: "clustermap-system", StatusNamespaceMissing: true},
			"namespace clustermap-system does not exist and no namespace holds a clustermap-status Lease", ""},
		{"namespace there, no Lease", Read{StatusNamespace: "clustermap-system"},
			"no clustermap-status Lease in namespace clustermap-system: the controller is not running, or cannot write its status Lease", ""},
		{"several controllers elsewhere", Read{StatusNamespace: "clustermap-system", LeasesElsewhere: []coordinationv1.Lease{*elsewhere, *other}},
			"controllers report in namespaces platform, team-b: pass --status-namespace", ""},
		{"the one controller elsewhere", Read{StatusNamespace: "clustermap-system", Lease: elsewhere},
			"", "the controller's status is in namespace platform, not clustermap-system: pass --status-namespace platform"},
	} {
		c.read.ClusterID, c.read.ClusterSet = "c1", "set"
		got := Summarize(c.read, now)
		if stuck := strings.Join(got.Stuck, ";"); (c.stuck == "") != (stuck == "") || !strings.Contains(stuck, c.stuck) {
			t.Errorf("%s: stuck %q, want %q", c.what, stuck, c.stuck)
		}
		if note := strings.Join(got.Notes, ";"); (c.note == "") != (note == "") || !strings.Contains(note, c.note) {
			t.Errorf("%s: notes %q, want %q", c.what, note, c.note)
		}
	}
}

// Exports and imports whose conditions say they fail are listed, with the
// reason and message; healthy ones, and a Conflict, are not.
func TestSummarizeFailing(t *testing.T) {
	c := func(t string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: reason + " said"}
	}
	se := func(name string, cs ...metav1.Condition) mcsv1beta1.ServiceExport {
		return mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: mcsv1beta1.ServiceExportStatus{Conditions: cs}}
	}
	si := func(name string, cs ...metav1.Condition) mcsv1beta1.ServiceImport {
		return mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: mcsv1beta1.ServiceImportStatus{Conditions: cs}}
	}
	r := Read{ClusterID: "c1", ClusterSet: "set", Lease: lease(now, nil),
		Exports: []mcsv1beta1.ServiceExport{
			se("ok", c("Valid", metav1.ConditionTrue, "Valid"), c("Ready", metav1.ConditionTrue, "Exported"), c("Conflict", metav1.ConditionTrue, "PortConflict")),
			se("noservice", c("Valid", metav1.ConditionFalse, "NoService"), c("Ready", metav1.ConditionFalse, "Failed")),
		},
		Imports: []mcsv1beta1.ServiceImport{
			si("ok", c("Ready", metav1.ConditionTrue, "Ready")),
			si("refused", c("Ready", metav1.ConditionFalse, "Pending")),
			si("held", c(imports.ConditionRemovalHeld, metav1.ConditionTrue, "ExportedNowhereAfterStart")),
			si("capped", c(imports.ConditionEndpointsCapped, metav1.ConditionTrue, "MaxImportEndpoints")),
		}}
	got := Summarize(r, now).Failing
	want := []string{"ServiceExport ns/noservice: Valid False/NoService: NoService said", "ServiceExport ns/noservice: Ready False/Failed",
		"ServiceImport ns/refused: Ready False/Pending", "ServiceImport ns/held: RemovalHeld: ExportedNowhereAfterStart said", "ServiceImport ns/capped: EndpointsCapped"}
	if len(got) != len(want) {
		t.Fatalf("failing %q; want %d lines", got, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("failing line %d %q; want it to start %q", i, got[i], w)
		}
	}
}
