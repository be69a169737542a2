package recordfmt

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

func sampleExport(cluster string) registry.Export {
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	return registry.Export{
		ClusterSet: "set", Cluster: cluster, Key: registry.Key{Namespace: "ns", Name: "web"},
		Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{http, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}},
		SessionAffinity:       corev1.ServiceAffinityClientIP,
		SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
		IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal),
		TrafficDistribution:   ptr.To("PreferClose"),
		Labels:                map[string]string{"team": "a"}, Annotations: map[string]string{"note": "x"},
		Created: time.UnixMilli(1700000000123),
		Endpoints: []registry.Endpoint{
			{IP: "10.0.0.1", Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Ready: true, Serving: true, Hostname: "web-0", NodeName: "n1", ServicePort: http, TargetPort: "http"},
			{IP: "fd00::1", Port: 8080, PortName: "http", Protocol: corev1.ProtocolTCP, Ready: false, ServicePort: http, TargetPort: "http"},
		},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	e := sampleExport("c1")
	enc, err := Encode(e, "clustermap test", RecordVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) != 3 {
		t.Fatalf("want a service record and 2 endpoint records, got %d", len(enc))
	}
	var instances []Instance
	for id, a := range enc {
		instances = append(instances, Instance{ID: id, Attrs: a})
	}
	got := Decode(e.Key, instances)
	if len(got) != 1 {
		t.Fatalf("decoded %d exports", len(got))
	}
	e.RecordVersion = RecordVersion
	if !reflect.DeepEqual(got[0], e) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got[0], e)
	}
}

// Version skew: records of the previous format (no version), of this one,
// and of a later one (which only adds attributes) all decode to the same
// export; a version that is no version is reported, the rest still read.
func TestRecordVersions(t *testing.T) {
	e := sampleExport("c1")
	for _, c := range []struct {
		what    string
		version int
		edit    func(Attrs)
		want    int
		invalid bool
	}{
		{"the previous format", 1, nil, 1, false},
		{"this format", RecordVersion, nil, RecordVersion, false},
		{"a later format", RecordVersion, func(a Attrs) { a[AttrRecordVersion] = "3"; a["SOME_LATER_ATTRIBUTE"] = "x" }, 3, false},
		{"no version at all", RecordVersion, func(a Attrs) { a[AttrRecordVersion] = "two" }, 1, true},
	} {
		enc, err := Encode(e, "clustermap", c.version)
		if err != nil {
			t.Fatal(err)
		}
		rec := enc[ServiceRecordID(e.ClusterSet, e.Cluster)]
		if _, has := rec[AttrRecordVersion]; has != (c.version >= 2) {
			t.Errorf("%s: version attribute written: %v", c.what, has)
		}
		if c.edit != nil {
			c.edit(rec)
		}
		var instances []Instance
		for id, a := range enc {
			instances = append(instances, Instance{ID: id, Attrs: a})
		}
		got := Decode(e.Key, instances)[0]
		if got.RecordVersion != c.want || (len(got.Invalid) > 0) != c.invalid {
			t.Errorf("%s: version %d (want %d), invalid %v", c.what, got.RecordVersion, c.want, got.Invalid)
		}
		if (got.Newer != "") != (c.want > RecordVersion) {
			t.Errorf("%s: newer %q", c.what, got.Newer)
		}
		got.RecordVersion, got.Invalid, got.Newer = 0, nil, ""
		if !reflect.DeepEqual(got, e) {
			t.Errorf("%s: decoded\n %+v\nwant %+v", c.what, got, e)
		}
	}
}

// The AWS controller's attribute names and values, for clusters that mix it
// with clustermap.
func TestEndpointRecordUsesTheAWSSchema(t *testing.T) {
	enc, _ := Encode(sampleExport("c1"), "clustermap", RecordVersion)
	a := enc[EndpointID("set", "c1", sampleExport("c1").Endpoints[0])]
	want := map[string]string{
		"AWS_INSTANCE_IPV4": "10.0.0.1", "AWS_INSTANCE_PORT": "8080", "ENDPOINT_PORT_NAME": "http", "ENDPOINT_PROTOCOL": "TCP",
		"READY": "true", "HOSTNAME": "web-0", "NODENAME": "n1", "CLUSTER_ID": "c1", "CLUSTERSET_ID": "set",
		"SERVICE_PORT_NAME": "http", "SERVICE_PORT": "80", "SERVICE_TARGET_PORT": "http", "SERVICE_PROTOCOL": "TCP",
		"SERVICE_TYPE": "ClusterSetIP", "SERVICE_EXPORT_CREATION_TIMESTAMP": "1700000000123", "K8S_CONTROLLER": "clustermap",
	}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("endpoint record:\n got %v\nwant %v", a, want)
	}
}

// An export written by the AWS controller: endpoint records only.
func TestDecodeForeignExport(t *testing.T) {
	aws := func(ip, ready string) Instance {
		return Instance{ID: "tcp-" + ip + "-80", Attrs: Attrs{
			"AWS_INSTANCE_IPV4": ip, "AWS_INSTANCE_PORT": "8080", "ENDPOINT_PORT_NAME": "http", "ENDPOINT_PROTOCOL": "TCP",
			"READY": ready, "CLUSTER_ID": "aws-cluster", "CLUSTERSET_ID": "set", "SERVICE_PORT_NAME": "http", "SERVICE_PORT": "80",
			"SERVICE_PROTOCOL": "TCP", "SERVICE_TARGET_PORT": "8080", "SERVICE_TYPE": "Headless", "SERVICE_EXPORT_CREATION_TIMESTAMP": "1600000000000",
			"K8S_CONTROLLER": "aws-cloud-map-mcs-controller-for-k8s 0.3.1",
		}}
	}
	got := Decode(registry.Key{Namespace: "ns", Name: "web"}, []Instance{aws("10.1.0.2", "true"), aws("10.1.0.1", "false"), {ID: "stray", Attrs: Attrs{"AWS_INSTANCE_IPV4": "1.2.3.4"}}})
	if len(got) != 1 {
		t.Fatalf("want one export, got %+v", got)
	}
	e := got[0]
	if !e.Foreign || e.Cluster != "aws-cluster" || e.Type != mcsv1beta1.Headless || !e.Created.Equal(time.UnixMilli(1600000000000)) {
		t.Errorf("foreign export: %+v", e)
	}
	if len(e.Ports) != 1 || e.Ports[0] != (mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}) {
		t.Errorf("ports derived from endpoint records: %+v", e.Ports)
	}
	if len(e.Endpoints) != 2 || e.Endpoints[0].IP != "10.1.0.1" || e.Endpoints[0].Ready || !e.Endpoints[1].Ready {
		t.Errorf("endpoints: %+v", e.Endpoints)
	}
}

func TestIDsDifferAcrossClustersAndFit(t *testing.T) {
	ep := registry.Endpoint{IP: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Port: 65535, Protocol: corev1.ProtocolSCTP}
	a, b := EndpointID("set", "c1", ep), EndpointID("set", "c2", ep)
	if a == b {
		t.Errorf("the same pod address in two clusters gives one id: %s", a)
	}
	if len(a) > instanceIDLength || len(ServiceRecordID("set", strings.Repeat("c", 63))) > instanceIDLength {
		t.Errorf("id longer than %d: %s", instanceIDLength, a)
	}
	if EndpointID("set", "c1", ep) != a {
		t.Error("ids are not stable")
	}
}

func TestEncodeLimits(t *testing.T) {
	e := sampleExport("c1")
	e.Annotations = map[string]string{"big": strings.Repeat("x", 1100)}
	if _, err := Encode(e, "c", RecordVersion); err == nil || !strings.Contains(err.Error(), "1024") {
		t.Errorf("an oversized annotation: %v", err)
	}
	e = sampleExport("c1")
	e.Endpoints = nil
	for i := 0; i < MaxInstances; i++ {
		e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: fmt.Sprintf("10.0.%d.%d", i/250, i%250), Port: 80, Protocol: corev1.ProtocolTCP})
	}
	_, err := Encode(e, "c", RecordVersion)
	var le *LimitError
	if err == nil || !errors.As(err, &le) || !strings.Contains(err.Error(), "1000") {
		t.Errorf("1,000 endpoints and a service record: %v", err)
	}
}

func TestPlanChangesOnlyTheDifference(t *testing.T) {
	current := map[string]Attrs{
		"keep":    {"CLUSTER_ID": "c", "READY": "true", "SOMEONE_ELSES": "x", "K8S_CONTROLLER": "old version"},
		"change":  {"CLUSTER_ID": "c", "READY": "true"},
		"removed": {"CLUSTER_ID": "c"},
	}
	desired := map[string]Attrs{
		"keep":   {"CLUSTER_ID": "c", "READY": "true", "K8S_CONTROLLER": "new version"},
		"change": {"CLUSTER_ID": "c", "READY": "false"},
		"new":    {"CLUSTER_ID": "c"},
	}
	c := Diff(desired, current)
	reg, dereg := c.Register, c.Deregister
	if len(reg) != 2 || reg["change"] == nil || reg["new"] == nil {
		t.Errorf("register: %v", reg)
	}
	if !reflect.DeepEqual(dereg, []string{"removed"}) {
		t.Errorf("deregister: %v", dereg)
	}
}

// Records that would fail an EndpointSlice or do not decode are skipped and
// reported by id; the valid ones stay.
func TestDecodeSkipsInvalidRecords(t *testing.T) {
	instances := encoded(t, sampleExport("c1"))
	good := len(sampleExport("c1").Endpoints)
	base := Attrs{AttrClusterID: "c1", AttrClusterSetID: "set", AttrPort: "8080", AttrIPv4: "10.0.0.9"}
	bad := map[string]func(Attrs){
		"bad-port":     func(a Attrs) { a[AttrPort] = "70000" },
		"bad-address":  func(a Attrs) { a[AttrIPv4] = "10.0.0.300" },
		"v6-as-v4":     func(a Attrs) { a[AttrIPv4] = "fd00::9" },
		"bad-hostname": func(a Attrs) { a[AttrHostname] = "Not_A_Label" },
		"bad-protocol": func(a Attrs) { a[AttrEndpointProtocol] = "ICMP" },
		"loopback":     func(a Attrs) { a[AttrIPv4] = "127.0.0.1" },
		"metadata":     func(a Attrs) { a[AttrIPv4] = "169.254.169.254" },
		"v6-loopback":  func(a Attrs) { delete(a, AttrIPv4); a[AttrIPv6] = "::1" },
		"v6-linklocal": func(a Attrs) { delete(a, AttrIPv4); a[AttrIPv6] = "fe80::1" },
		"multicast":    func(a Attrs) { a[AttrIPv4] = "224.0.0.1" },
		"bad-portname": func(a Attrs) { a[AttrEndpointPortName] = "Web_Port" },
		"bad-svc-port": func(a Attrs) { a[AttrServicePortName] = "-x" },
		"bad-node":     func(a Attrs) { a[AttrNodeName] = "Node One" },
	}
	for id, mutate := range bad {
		a := Attrs{}
		for k, v := range base {
			a[k] = v
		}
		mutate(a)
		instances = append(instances, Instance{ID: id, Attrs: a})
	}
	for i := range instances {
		if instances[i].Attrs[AttrRecord] == RecordValue {
			instances[i].Attrs[AttrExportedLabels] = "{not json"
		}
	}
	out := Decode(registry.Key{Namespace: "ns", Name: "web"}, instances)
	if len(out) != 1 {
		t.Fatalf("want one export, got %d", len(out))
	}
	e := out[0]
	if len(e.Endpoints) != good || e.Labels != nil || len(e.Ports) != 2 {
		t.Errorf("endpoints %d (want %d), labels %v, ports %v", len(e.Endpoints), good, e.Labels, e.Ports)
	}
	var ids []string
	for _, inv := range e.Invalid {
		ids = append(ids, inv.ID)
		if inv.Reason == "" {
			t.Errorf("%s: no reason", inv.ID)
		}
	}
	if len(ids) != len(bad)+1 || !strings.Contains(strings.Join(ids, ","), "bad-port") {
		t.Errorf("invalid records %v, want the %d bad endpoints and the service record", e.Invalid, len(bad))
	}
}

func portsFromEndpoints(e registry.Export) bool {
	return len(e.Ports) > 0 && validServicePorts(e.Ports) == nil
}

// Each service-record field the objects of an import could not hold is
// dropped alone, and said; the rest of the record stands.
func TestDecodeDropsInvalidRecordFields(t *testing.T) {
	for _, c := range []struct {
		attr, value string
		check       func(registry.Export) bool
	}{
		{AttrServiceType, "LoadBalancer", func(e registry.Export) bool { return e.Type == mcsv1beta1.ClusterSetIP }},
		{AttrServicePorts, `[{"name":"a","port":80,"protocol":"TCP"},{"name":"a","port":81,"protocol":"TCP"}]`, portsFromEndpoints},
		{AttrServicePorts, `[{"name":"a","port":0,"protocol":"TCP"}]`, portsFromEndpoints},
		{AttrServicePorts, `[{"name":"a","port":80,"protocol":"ICMP"}]`, portsFromEndpoints},
		{AttrSessionAffinity, "Sticky", func(e registry.Export) bool { return e.SessionAffinity == corev1.ServiceAffinityNone }},
		{AttrSessionAffinityTime, "4294967297", func(e registry.Export) bool { return e.SessionAffinityConfig == nil }},
		{AttrSessionAffinityTime, "0", func(e registry.Export) bool { return e.SessionAffinityConfig == nil }},
		{AttrIPFamilies, "IPv4,IPv4", func(e registry.Export) bool { return e.IPFamilies == nil }},
		{AttrIPFamilies, "IPv5", func(e registry.Export) bool { return e.IPFamilies == nil }},
		{AttrInternalTrafficPolicy, "Nearby", func(e registry.Export) bool { return e.InternalTrafficPolicy == nil }},
		{AttrTrafficDistribution, "Anywhere", func(e registry.Export) bool { return e.TrafficDistribution == nil }},
		{AttrExportedLabels, `{"bad key!":"x"}`, func(e registry.Export) bool { return e.Labels == nil }},
		{AttrExportedLabels, `{"team":"not a value"}`, func(e registry.Export) bool { return e.Labels == nil }},
		{AttrExportedAnnotations, `{"Bad/Key/x":"x"}`, func(e registry.Export) bool { return e.Annotations == nil }},
	} {
		instances := encoded(t, sampleExport("c1"))
		for _, in := range instances {
			if in.Attrs[AttrRecord] == RecordValue {
				in.Attrs[c.attr] = c.value
			}
		}
		out := Decode(registry.Key{Namespace: "ns", Name: "web"}, instances)
		if len(out) != 1 || len(out[0].Endpoints) != len(sampleExport("c1").Endpoints) {
			t.Fatalf("%s=%s: %+v", c.attr, c.value, out)
		}
		e := out[0]
		if len(e.Invalid) != 1 || !strings.Contains(e.Invalid[0].Reason, c.attr) || !c.check(e) {
			t.Errorf("%s=%s: invalid %v, export %+v", c.attr, c.value, e.Invalid, e)
		}
	}
}

// A record claims a cluster by its CLUSTER_ID; clustermap's own records
// carry the cluster in their ids too, and one whose id names another
// cluster is refused. A CLUSTER_ID that no label can hold makes no export;
// a creation time before 2020 or an hour ahead is taken as now (it would
// win every conflict).
func TestDecodeChecksWhoWrote(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	instances := encoded(t, sampleExport("c1"))
	good := len(instances)
	// c1's records copied under c2's name, ids unchanged; one under a name
	// no label can hold.
	for _, in := range instances[:good] {
		a := maps.Clone(in.Attrs)
		a[AttrClusterID] = "c2"
		instances = append(instances, Instance{ID: in.ID, Attrs: a})
	}
	weird := maps.Clone(instances[0].Attrs)
	weird[AttrClusterID] = "not a label value!"
	instances = append(instances, Instance{ID: "weird", Attrs: weird})
	out, impostors := DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, instances, now, registry.DefaultMaxImportEndpoints)
	// c2's records are all impostors: no export of c2 (it would keep an
	// import alive, and win conflicts, with records of nothing); they are
	// said on c1's export, naming c2.
	if len(out) != 1 || out[0].Cluster != "c1" || len(impostors) != 0 {
		t.Fatalf("exports %+v, left %v", out, impostors)
	}
	if len(out[0].Endpoints) != len(sampleExport("c1").Endpoints) || len(out[0].Invalid) != good {
		t.Errorf("c1: invalid %v, %d endpoints", out[0].Invalid, len(out[0].Endpoints))
	}
	for _, inv := range out[0].Invalid {
		if inv.Cluster != "c2" {
			t.Errorf("a refused record of c2 said as %+v", inv)
		}
	}
	if _, left := DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, instances[good:], now, registry.DefaultMaxImportEndpoints); len(left) != good {
		t.Errorf("with no export to say them on, %d refused records are returned, want %d", len(left), good)
	}
	// Beside a record of its own, a cluster's impostors are said on its
	// export.
	own := encoded(t, sampleExport("c2"))
	out, impostors = DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, append(instances, own...), now, registry.DefaultMaxImportEndpoints)
	if len(out) != 2 || out[1].Cluster != "c2" || len(out[1].Invalid) != good || len(impostors) != 0 {
		t.Errorf("c2 with records of its own: exports %+v, impostors %v", out, impostors)
	}

	for _, c := range []struct {
		created time.Time
		sane    bool
	}{
		{time.UnixMilli(1), false},
		{now.Add(2 * time.Hour), false},
		{now.Add(-24 * time.Hour), true},
		{now.Add(30 * time.Minute), true},
	} {
		e := sampleExport("c1")
		e.Created = c.created
		decoded, _ := DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, encoded(t, e), now, registry.DefaultMaxImportEndpoints)
		got := decoded[0]
		if c.sane && (!got.Created.Equal(c.created.Truncate(time.Millisecond)) || len(got.Invalid) != 0) {
			t.Errorf("created %v: decoded %v, invalid %v", c.created, got.Created, got.Invalid)
		}
		if !c.sane && (!got.Created.Equal(now) || len(got.Invalid) != 1) {
			t.Errorf("created %v: decoded %v (want now), invalid %v", c.created, got.Created, got.Invalid)
		}
	}
}

// A cluster id is a DNS label, lowercase: a cluster "Cluster-A" (valid
// records otherwise) exports nothing, and its records are said, naming it,
// on the export of "cluster-a", whose per-pod DNS names it would share.
func TestClusterIDMustBeADNSLabel(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	mixed := sampleExport("Cluster-A")
	out, left := DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, append(encoded(t, sampleExport("cluster-a")), encoded(t, mixed)...), now, registry.DefaultMaxImportEndpoints)
	if len(out) != 1 || out[0].Cluster != "cluster-a" || len(left) != 0 {
		t.Fatalf("exports %+v, left %v: want cluster-a's only", out, left)
	}
	if len(out[0].Invalid) == 0 {
		t.Fatal("Cluster-A's records were not said")
	}
	for _, inv := range out[0].Invalid {
		if inv.Cluster != "Cluster-A" || !strings.Contains(inv.Reason, "not a DNS-1123 label") {
			t.Errorf("refused record %+v, want Cluster-A's, as not a DNS-1123 label", inv)
		}
	}
}

// Records that are refused make no export: a cluster with only invalid
// records is exporting nothing (no import kept alive by them), and a
// refused record's creation time wins no conflict for its cluster.
func TestRefusedRecordsMakeNoExport(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	forged := func(id, cluster, ip, created string) Instance {
		return Instance{ID: id, Attrs: Attrs{AttrIPv4: ip, AttrPort: "80", AttrClusterID: cluster, AttrClusterSetID: "set",
			AttrExportCreationTime: created, AttrServiceType: "ClusterSetIP"}}
	}
	instances := encoded(t, sampleExport("c1"))
	want := sampleExport("c1").Created.UnixMilli()
	instances = append(instances,
		forged("loopback-c2", "c2", "127.0.0.1", "1577836800001"),
		forged("metadata-c2", "c2", "169.254.169.254", "1577836800001"),
		forged("loopback-c1", "c1", "127.0.0.1", "1577836800001"))
	out, _ := DecodeAt(registry.Key{Namespace: "ns", Name: "web"}, instances, now, registry.DefaultMaxImportEndpoints)
	if len(out) != 1 || out[0].Cluster != "c1" {
		t.Fatalf("exports %+v, want c1's only", out)
	}
	if out[0].Created.UnixMilli() != want {
		t.Errorf("c1: created %v, want %v", out[0].Created, time.UnixMilli(want))
	}
	var c1, c2 int
	for _, inv := range out[0].Invalid {
		switch inv.Cluster {
		case "":
			c1++
		case "c2":
			c2++
		}
	}
	if c1 != 1 || c2 != 2 {
		t.Errorf("invalid %v: want c1's loopback record and c2's two, naming c2", out[0].Invalid)
	}
}

// encoded is an export's records as Cloud Map would list them.
func encoded(t *testing.T, e registry.Export) []Instance {
	t.Helper()
	enc, err := Encode(e, "clustermap test", RecordVersion)
	if err != nil {
		t.Fatal(err)
	}
	var instances []Instance
	for id, a := range enc {
		instances = append(instances, Instance{ID: id, Attrs: a})
	}
	return instances
}
