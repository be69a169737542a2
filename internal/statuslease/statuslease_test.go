package statuslease

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// What changes on every read does not make a write; a change of state does.
func TestSignature(t *testing.T) {
	base := map[string]string{AnnotationCluster: "c1", AnnotationLastSync: "2026-11-22T10:00:00Z", AnnotationCloudMapErr: ""}
	later := map[string]string{AnnotationCluster: "c1", AnnotationLastSync: "2026-11-22T10:00:30Z", AnnotationCloudMapErr: ""}
	failing := map[string]string{AnnotationCluster: "c1", AnnotationLastSync: "2026-11-22T10:00:30Z", AnnotationCloudMapErr: "503, RequestID: a"}
	failingAgain := map[string]string{AnnotationCluster: "c1", AnnotationLastSync: "2026-11-22T10:00:30Z", AnnotationCloudMapErr: "503, RequestID: b"}
	peerDown := map[string]string{AnnotationCluster: "c1", AnnotationLastSync: "2026-11-22T10:00:30Z", AnnotationCloudMapErr: "", AnnotationPeersDown: "c2"}
	if signature(base) != signature(later) {
		t.Error("a newer sync time alone should wait for the heartbeat")
	}
	if signature(later) == signature(failing) {
		t.Error("Cloud Map failing should be written at once")
	}
	if signature(failing) != signature(failingAgain) {
		t.Error("another failure's wording should wait for the heartbeat")
	}
	if signature(later) == signature(peerDown) {
		t.Error("a peer going down should be written at once")
	}
	if signature(map[string]string{AnnotationCluster: "c1", AnnotationCloudMapErr: ""}) == signature(base) {
		t.Error("the first sync should be written at once")
	}
	if signature(nil) == signature(base) {
		t.Error("the first report should be written")
	}
}

// Each Region's (and account's) reads are reported apart; the overall sync
// is the oldest, the overall error the first failing source's; one source
// starting to fail is news, another sync of a working one is not.
func TestSources(t *testing.T) {
	r := &Reporter{}
	r.CloudMapRead("us-east-1/111111111111", nil)
	r.CloudMapRead("eu-west-1/111111111111", nil)
	first := r.annotations()
	r.CloudMapRead("us-east-1/111111111111", nil)
	if signature(first) != signature(r.annotations()) {
		t.Error("another sync of a working Region should wait for the heartbeat")
	}
	r.CloudMapRead("eu-west-1/111111111111", errors.New("503 in eu-west-1"))
	a := r.annotations()
	if signature(first) == signature(a) {
		t.Error("a Region starting to fail should be written at once")
	}
	if a[AnnotationCloudMapErr] != "503 in eu-west-1" {
		t.Errorf("overall error %q", a[AnnotationCloudMapErr])
	}
	var sources map[string]Source
	if err := json.Unmarshal([]byte(a[AnnotationSources]), &sources); err != nil || len(sources) != 2 ||
		sources["eu-west-1/111111111111"].Error == "" || sources["us-east-1/111111111111"].LastSync == nil {
		t.Errorf("sources %s (%v)", a[AnnotationSources], err)
	}
}

// Proofs read in several Regions: each cluster's newest proof, drained
// where any Region drains it; a drain is news (written at once), a newer
// proof waits for the heartbeat.
func TestProofsAcrossRegions(t *testing.T) {
	r := &Reporter{}
	t1, t2 := time.Unix(1_000, 0).UTC(), time.Unix(2_000, 0).UTC()
	r.SetProofs("us-east-1", map[string]time.Time{"a": t1, "b": t2}, map[string]bool{"a": true})
	r.SetProofs("eu-west-1", map[string]time.Time{"a": t2}, nil)
	a := r.annotations()
	var got map[string]Proof
	if err := json.Unmarshal([]byte(a[AnnotationProofs]), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]Proof{"a": {Last: t2, Drained: true}, "b": {Last: t2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("proofs %v, want %v", got, want)
	}
	before := signature(a)
	r.SetProofs("eu-west-1", map[string]time.Time{"a": t2.Add(time.Minute)}, nil)
	if signature(r.annotations()) != before {
		t.Error("a newer proof changed the signature: it would be written at once")
	}
	r.SetProofs("us-east-1", map[string]time.Time{"a": t1, "b": t2}, nil)
	if signature(r.annotations()) == before {
		t.Error("a restored cluster did not change the signature")
	}
}
