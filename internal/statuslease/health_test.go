package statuslease

import (
	"encoding/json"
	"errors"
	"testing"
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
