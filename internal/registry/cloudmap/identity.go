package cloudmap

import (
	"crypto/sha256"
	"encoding/hex"
	"iter"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Two clusters configured with the same cluster id write the same
// instance ids and overwrite each other's exports. The service record
// names the installation that wrote it (a hash of its kube-system
// namespace's UID, which no two clusters share): a record under this
// cluster's id by another installation is a duplicate id, reported on
// both clusters, since each reads the other's writes.

// WriterMark is an installation's mark from its kube-system UID.
func WriterMark(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(sum[:])[:recordfmt.WriterMarkLength]
}

// reportEvery spaces the reports of one identity problem (a duplicate on
// one service, one account's records under another's cluster).
const reportEvery = 10 * time.Minute

// due reports whether the problem what was not reported in the last
// reportEvery, and notes it as reported now.
func (b *Backend) due(what string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reported == nil {
		b.reported = map[string]time.Time{}
	}
	if last, ok := b.reported[what]; ok && time.Since(last) < reportEvery {
		return false
	}
	b.reported[what] = time.Now()
	return true
}

// otherWriter is the mark of another installation on this cluster's
// service record among records, if any.
func (b *Backend) otherWriter(records iter.Seq[recordfmt.Attrs]) string {
	if b.o.Writer == "" {
		return ""
	}
	for a := range records {
		if a[recordfmt.AttrClusterID] == b.o.Cluster && a[recordfmt.AttrClusterSetID] == b.o.ClusterSet && a[recordfmt.AttrRecord] == recordfmt.RecordValue &&
			a[recordfmt.AttrWriter] != "" && a[recordfmt.AttrWriter] != b.o.Writer {
			return a[recordfmt.AttrWriter]
		}
	}
	return ""
}

// checkWriter reports another installation's records under this
// cluster's id, at most once per duplicateReportEvery for a service.
func (b *Backend) checkWriter(key registry.Key, records iter.Seq[recordfmt.Attrs]) {
	other := b.otherWriter(records)
	if other == "" || !b.due("duplicate "+key.String()) {
		return
	}
	b.o.Log.Error(nil, "another cluster writes Cloud Map records under this cluster's id: two clusters share it and overwrite each other's exports; give each its own id (the id.k8s.io ClusterProperty, or --cluster-name)",
		"cluster", b.o.Cluster, "service", key.String(), "otherInstallation", other, "thisInstallation", b.o.Writer)
	b.o.Observer.Duplicate(key, other)
}
