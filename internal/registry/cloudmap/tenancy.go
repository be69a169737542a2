package cloudmap

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// A clusterset across AWS accounts (Backend.Owner set) lives in namespaces
// the owner account creates and shares through AWS RAM. Cloud Map then
// changes three things (docs/accounts-and-regions.md):
//   - another account's namespaces and services are named by ARN, and
//     Discover* calls name the owner (OwnerAccount);
//   - nothing in a shared namespace takes tags: what clustermap created is
//     told by CreatedByAccount and the CreatorRequestId it sets;
//   - ListOperations never shows other accounts' operations, so the change
//     feed is a change record per cluster instead (below).

// shared reports whether the clusterset's namespaces are shared ones.
func (b *Backend) shared() bool { return b.o.Owner != "" }

// ownerAccount is the OwnerAccount of Discover* calls: the owner's in a
// shared namespace, none in one account.
func (b *Backend) ownerAccount() *string {
	if b.shared() {
		return aws.String(b.o.Owner)
	}
	return nil
}

// ref is how calls name a resource: by ARN in a shared namespace (any
// account's resources answer to it), else by id as before.
func (b *Backend) ref(id, arn *string) string {
	if b.shared() && aws.ToString(arn) != "" {
		return aws.ToString(arn)
	}
	return aws.ToString(id)
}

// idOf is a ref's id: an ARN ends in it.
func idOf(ref string) string {
	if strings.HasPrefix(ref, "arn:") {
		return ref[strings.LastIndexByte(ref, '/')+1:]
	}
	return ref
}

// creatorMark is the CreatorRequestId of the services clustermap creates
// in a shared namespace for a clusterset, where tags cannot mark them
// (ownership.go). Being an idempotency token too, a retried create by the
// same account returns the service it made.
func creatorMark(clusterSet string) string {
	sum := sha256.Sum256([]byte(clusterSet))
	return "clustermap-" + hex.EncodeToString(sum[:8])
}
