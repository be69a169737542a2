package cloudmapdns

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestTargetOf(t *testing.T) {
	for _, c := range []struct {
		ann     map[string]string
		ok      bool
		errText string
	}{
		{nil, false, ""},
		{map[string]string{AnnotationNamespace: "test-namespace", AnnotationHostname: "nginx-service"}, true, ""},
		{map[string]string{AnnotationNamespace: "test-namespace", AnnotationHostname: "_grpc"}, true, ""},
		{map[string]string{AnnotationNamespace: "test-namespace"}, true, AnnotationHostname + " is missing"},
		{map[string]string{AnnotationHostname: "x"}, true, AnnotationNamespace + " is missing"},
		{map[string]string{AnnotationNamespace: "test-namespace", AnnotationHostname: "a.b"}, true, "not a valid hostname"},
		{map[string]string{AnnotationNamespace: "test-namespace", AnnotationHostname: "x-"}, true, "not a valid hostname"},
		{map[string]string{AnnotationNamespace: "test-namespace", AnnotationHostname: strings.Repeat("a", 64)}, true, "not a valid hostname"},
		{map[string]string{AnnotationNamespace: "has space", AnnotationHostname: "x"}, true, "not a Cloud Map namespace name"},
	} {
		_, ok, err := TargetOf(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: c.ann}})
		if ok != c.ok || (err == nil) != (c.errText == "") || err != nil && !strings.Contains(err.Error(), c.errText) {
			t.Errorf("%v: ok %v err %v, want ok %v error containing %q", c.ann, ok, err, c.ok, c.errText)
		}
	}
}

func TestDesiredAndPlan(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "nginx"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "admin", Port: 81}}}}
	slice := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("admin"), Port: ptr.To[int32](9090)}, {Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p1"}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		}}
	v6 := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00::1"}}}}
	desired := Desired("c1", svc, []discoveryv1.EndpointSlice{slice, v6})
	owner := Owner("c1", svc)
	one := desired[InstanceID(owner, "10.0.0.1")]
	if len(desired) != 2 || one[AttrIPv4] != "10.0.0.1" || one[AttrPort] != "8080" || one[AttrPod] != "p1" || one[AttrOwner] != "c1/web/nginx" {
		t.Fatalf("desired %v", desired)
	}
	if InstanceID("c1/web/nginx", "10.0.0.1") == InstanceID("c2/web/nginx", "10.0.0.1") {
		t.Error("two owners share an instance id")
	}

	ecs := Attrs{AttrIPv4: "172.31.0.1", "ECS_SERVICE_NAME": "nginx"}
	changed := Attrs{AttrIPv4: "10.0.0.3", AttrPort: "9999", AttrOwner: owner}
	stale := Attrs{AttrIPv4: "10.0.0.9", AttrOwner: owner}
	otherCluster := Attrs{AttrIPv4: "10.0.0.8", AttrOwner: "c2/web/nginx"}
	current := map[string]Attrs{
		"ecs-task-1":                           ecs,
		InstanceID(owner, "10.0.0.1"):          one,
		InstanceID(owner, "10.0.0.3"):          changed,
		InstanceID(owner, "10.0.0.9"):          stale,
		InstanceID("c2/web/nginx", "10.0.0.8"): otherCluster,
	}
	p := Diff([]string{owner}, desired, current)
	if len(p.Register) != 1 || p.Register[InstanceID(owner, "10.0.0.3")] == nil {
		t.Errorf("register %v, want only the changed instance", p.Register)
	}
	if !slices.Equal(p.Deregister, []string{InstanceID(owner, "10.0.0.9")}) {
		t.Errorf("deregister %v, want only our stale instance", p.Deregister)
	}
	// Someone else's instance under our id is left alone.
	current[InstanceID(owner, "10.0.0.1")] = ecs
	if p := Diff([]string{owner}, desired, current); p.Register[InstanceID(owner, "10.0.0.1")] != nil {
		t.Error("a foreign instance would be overwritten")
	}
	if p := Diff([]string{owner}, desired, desired); !p.Empty() {
		t.Errorf("plan against itself: %+v", p)
	}
	// After a change of cluster name: the instances of the name before are
	// ours too (and go), those of another cluster are not, nor the foreign
	// instance now under the old id of 10.0.0.1.
	renamed := Desired("c1-new", svc, []discoveryv1.EndpointSlice{slice})
	p = Diff([]string{Owner("c1-new", svc), owner}, renamed, current)
	if len(p.Register) != 2 || !slices.Equal(p.Deregister, []string{InstanceID(owner, "10.0.0.3"), InstanceID(owner, "10.0.0.9")}) {
		t.Errorf("after a rename: register %v, deregister %v; want both new, every old one out, c2's kept", p.Register, p.Deregister)
	}
}

func TestIntend(t *testing.T) {
	ann := map[string]string{AnnotationNamespace: "ns", AnnotationHostname: "web"}
	withAnn := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range ann {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	here, there := Target{"ns", "web"}, Target{"ns", "old"}
	now := metav1.Now()
	for _, c := range []struct {
		name       string
		ann        map[string]string
		inScope    bool
		deleting   bool
		finalizer  bool
		condition  bool
		remembered *Target
		allowed    []string
		want       Intent
		invalid    bool
	}{
		{name: "new", ann: ann, inScope: true, want: Intent{Target: here}},
		{name: "registered", ann: withAnn(map[string]string{AnnotationRegistered: "ns/web"}), inScope: true, want: Intent{Target: here}},
		{name: "hostname changed", ann: withAnn(map[string]string{AnnotationRegistered: "ns/old"}), inScope: true, want: Intent{Target: here, Withdraw: []Target{there}}},
		{name: "changed and changed back while remembered", ann: withAnn(map[string]string{AnnotationRegistered: "ns/web"}), inScope: true, remembered: &there, want: Intent{Target: here, Withdraw: []Target{there}}},
		{name: "annotations removed, restarted", ann: map[string]string{AnnotationRegistered: "ns/web"}, inScope: true, condition: true, want: Intent{Withdraw: []Target{here}, ClearCondition: true}},
		{name: "annotations removed by a user, in memory", ann: nil, inScope: true, remembered: &here, want: Intent{Withdraw: []Target{here}}},
		{name: "deleted", ann: withAnn(map[string]string{AnnotationRegistered: "ns/web"}), inScope: true, deleting: true, condition: true, want: Intent{Withdraw: []Target{here}}},
		{name: "namespace out of scope", ann: withAnn(map[string]string{AnnotationRegistered: "ns/web"}), want: Intent{Withdraw: []Target{here}}},
		{name: "invalid", ann: map[string]string{AnnotationHostname: "web", AnnotationRegistered: "ns/web"}, inScope: true, want: Intent{Withdraw: []Target{here}}, invalid: true},
		{name: "never annotated", inScope: true, want: Intent{}},
		{name: "an allowed Cloud Map namespace", ann: ann, inScope: true, allowed: []string{"other", "ns"}, want: Intent{Target: here}},
		{name: "a Cloud Map namespace not allowed", ann: ann, inScope: true, allowed: []string{"other"}, want: Intent{}, invalid: true},
		{name: "registered where no longer allowed", ann: withAnn(map[string]string{AnnotationRegistered: "ns/web"}), inScope: true, allowed: []string{"other"}, want: Intent{Withdraw: []Target{here}}, invalid: true},
		{name: "waiting, finalizer on", ann: ann, inScope: true, finalizer: true, want: Intent{Target: here}},
		{name: "deleted between its claim and the record of it", ann: ann, inScope: true, finalizer: true, deleting: true, want: Intent{Withdraw: []Target{here}}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b", Annotations: c.ann}}
		if c.deleting {
			svc.DeletionTimestamp = &now
		}
		if c.finalizer {
			svc.Finalizers = []string{Finalizer}
		}
		if c.condition {
			svc.Status.Conditions = []metav1.Condition{{Type: ConditionRegistered}}
		}
		got := Intend(svc, c.inScope, c.allowed, c.remembered)
		if (got.Invalid != nil) != c.invalid {
			t.Errorf("%s: invalid %v", c.name, got.Invalid)
		}
		got.Invalid = nil
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A write refused only because the instance's last operation still runs
// is retried quietly; any other error among them is reported.
func TestOnlyBusy(t *testing.T) {
	busy := fmt.Errorf("instance a: %w", &types.DuplicateRequest{Message: aws.String("still in progress")})
	other := fmt.Errorf("instance b: %w", &types.ResourceLimitExceeded{Message: aws.String("quota")})
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.Join(busy), true},
		{errors.Join(busy, errors.Join(busy)), true},
		{errors.Join(busy, other), false},
		{other, false},
	} {
		if got := onlyBusy(c.err); got != c.want {
			t.Errorf("onlyBusy(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// A drift check that runs as pods come and go tells the repairs (what
// memory held and Cloud Map lost, what Cloud Map held unknown to memory)
// from the endpoints' own changes.
func TestChangesOfADriftCheck(t *testing.T) {
	target := Target{Namespace: "ns", Hostname: "web"}
	a := func(ip string) Attrs { return Attrs{AttrIPv4: ip} }
	remembered := map[string]Attrs{"lost": a("10.0.0.1"), "gone": a("10.0.0.2"), "kept": a("10.0.0.3")}
	before := map[string]Attrs{"gone": a("10.0.0.2"), "kept": a("10.0.0.3"), "stray": a("10.0.0.9")}
	desired := map[string]Attrs{"lost": a("10.0.0.1"), "kept": a("10.0.0.3"), "new": a("10.0.0.4")}
	got := map[string]string{}
	for _, c := range Changes(target, remembered, before, desired, []string{"lost", "new"}, []string{"gone", "stray"}) {
		got[c.Reason] = c.Message
	}
	want := map[string]string{
		ReasonRegistered:    "Registered 10.0.0.4 to ns/web",
		ReasonDriftRepaired: "Restored 10.0.0.1 in ns/web",
		ReasonDeregistered:  "Deregistered 10.0.0.2 from ns/web",
		ReasonStaleRemoved:  "Deregistered stale IP 10.0.0.9 from ns/web",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	for _, c := range Changes(target, nil, before, desired, []string{"lost"}, []string{"stray"}) {
		if c.Reason != ReasonRegistered && c.Reason != ReasonDeregistered {
			t.Errorf("a sync without a drift check said %s", c.Reason)
		}
	}
}
