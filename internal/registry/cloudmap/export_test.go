package cloudmap

import (
	"strconv"
	"time"

	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// ChangeRecordAttrs are the attributes of a cluster's change record at
// seq, stating updated.
func ChangeRecordAttrs(clusterSet, cluster, epoch string, seq int64, updated time.Time) map[string]string {
	return map[string]string{recordfmt.AttrClusterID: cluster, recordfmt.AttrClusterSetID: clusterSet, attrEpoch: epoch,
		attrSeq: strconv.FormatInt(seq, 10), attrUpdated: strconv.FormatInt(updated.Unix(), 10)}
}
