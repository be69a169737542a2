package statuslease

import "testing"

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
