package cloudmap

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
)

// tenancy is where a clusterset lives, decided once in New: in one
// account (no Owner), or in namespaces an owner account creates and
// shares through AWS RAM with its member accounts, this cluster's
// included (docs/accounts-and-regions.md). Cloud Map behaves differently
// across accounts, and every branch on it is a method here:
//   - another account's namespaces and services are named by ARN, and
//     Discover* calls name the owner (OwnerAccount);
//   - nothing in a shared namespace takes tags: what clustermap created is
//     told by CreatedByAccount and the CreatorRequestId it sets;
//   - any member may write any record, under any cluster's name: records
//     are bound to the account that created them (accounts.go), whether
//     the owner shares strictly or permissively;
//   - ListOperations never shows other accounts' operations, so the change
//     feed is a change record per cluster instead (feed_records.go).
type tenancy struct {
	owner, account string
}

// shared: the clusterset's namespaces are an owner account's, shared.
func (t tenancy) shared() bool { return t.owner != "" }

// member: shared by another account, which alone creates namespaces; one
// not found may be one not shared with this account.
func (t tenancy) member() bool { return t.shared() && t.owner != t.account }

// ownership tells what clustermap created: by tags in one account, by
// the creator request id across accounts.
func (t tenancy) ownership(c *sd.Client, clusterSet string) ownership {
	if t.shared() {
		return requested{account: t.account, token: creatorMark(clusterSet)}
	}
	return tagged{c: c, clusterSet: clusterSet}
}

// holds says whether a listed namespace, owned by owner, may hold the
// clusterset: across accounts only the owner's, not this account's own.
func (t tenancy) holds(owner *string) bool { return !t.shared() || aws.ToString(owner) == t.owner }

// bindsWriters: records are kept only when created by the account their
// cluster is bound to (refuseForeign). In one account every writer has
// the controller's role, and no call tells them apart.
func (t tenancy) bindsWriters() bool { return t.shared() }

// feedsByRecords: the change feed is the clusters' change records, as
// ListOperations shows no other account's operations; in one account it
// is the operations.
func (t tenancy) feedsByRecords() bool { return t.shared() }

// confirmAfter is how long this cluster's own operations run before it
// asks how they ended (confirm.go): across accounts no feed tells it; in
// one account only what the feed missed.
func (t tenancy) confirmAfter() time.Duration {
	if t.shared() {
		return confirmAfter
	}
	return unseenAfter
}

// heardEarly: a change is heard of before its operation ends (from its
// writer's change record), so reading it again waits OperationWait too.
func (t tenancy) heardEarly() bool { return t.shared() }

// exportsProveAlive: in one account a cluster's publishes prove it alive
// (its operations move the feed every importer reads); across accounts
// only its change record does.
func (t tenancy) exportsProveAlive() bool { return !t.shared() }

// ownerAccount is the OwnerAccount of Discover* calls: the owner's in a
// shared namespace, none in one account.
func (t tenancy) ownerAccount() *string {
	if t.shared() {
		return aws.String(t.owner)
	}
	return nil
}

// ref is how calls name a resource: by ARN in a shared namespace (any
// account's resources answer to it), else by id.
func (t tenancy) ref(id, arn *string) string {
	if t.shared() && aws.ToString(arn) != "" {
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
