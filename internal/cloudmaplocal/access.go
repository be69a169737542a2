package cloudmaplocal

import (
	"slices"
	"strings"
)

// Who may see and change what, across accounts. A namespace belongs to the
// account that created it; RAM shares (Server.Share) let other accounts use
// it. The rules follow the Cloud Map Developer Guide's pages on shared
// namespaces; where they are silent the emulator takes the strict reading,
// listed in cloudmap-local --help.

// visibleTo reports whether account may use ns: its owner or an account
// it is shared with.
func (s *region) visibleTo(ns *namespaceRec, account string) bool {
	return ns.Owner == account || slices.Contains(s.st.Shares[ns.Id], account)
}

// shared reports whether a namespace is shared with any account.
func (s *region) shared(nsID string) bool { return len(s.st.Shares[nsID]) > 0 }

// addressed applies the service's addressing rule: a caller names its own
// resources by id or ARN, another account's only by ARN.
func addressed(idOrARN, arn string, own bool) bool {
	if strings.HasPrefix(idOrARN, "arn:") {
		return idOrARN == arn
	}
	return own
}

// namespace finds a namespace account may use, named as the rules require.
// Callers hold s.mu.
func (s *region) namespace(idOrARN, account string) (*namespaceRec, error) {
	ns := s.st.Namespaces[resourceID(idOrARN)]
	if ns == nil || !s.visibleTo(ns, account) || !addressed(idOrARN, ns.Arn, ns.Owner == account) {
		return nil, errorf("NamespaceNotFound", "Namespace %s not found", idOrARN)
	}
	return ns, nil
}

// service finds a service account may use, named as the rules require,
// and its namespace. Callers hold s.mu.
func (s *region) service(idOrARN, account string) (*serviceRec, *namespaceRec, error) {
	svc := s.st.Services[resourceID(idOrARN)]
	if svc == nil {
		return nil, nil, errorf("ServiceNotFound", "Service %s not found", idOrARN)
	}
	ns := s.st.Namespaces[svc.NamespaceId]
	if ns == nil || !s.visibleTo(ns, account) || !addressed(idOrARN, svc.Arn, ns.Owner == account) {
		return nil, nil, errorf("ServiceNotFound", "Service %s not found", idOrARN)
	}
	return svc, ns, nil
}

// mayChange reports whether account may change or remove what createdBy
// made in ns: the namespace's owner may change anything in it, others
// only what they made themselves (the docs are silent on a consumer
// changing another account's resources: strict reading), or anything with
// PermissiveSharing.
func (s *region) mayChange(ns *namespaceRec, createdBy, account string) bool {
	return s.opts.PermissiveSharing || ns.Owner == account || createdBy == account
}

func accessDenied(account, action, arn string) *apiError {
	return errorf("AccessDeniedException", "User: arn:aws:iam::%s:root is not authorized to perform: servicediscovery:%s on resource: %s", account, action, arn)
}

// untaggable refuses tags on a shared namespace and what is in it:
// "tagging is not supported for shared namespaces" (strict reading: its
// services too, and for the owner as well while the share lasts).
func untaggable(nsID string) *apiError {
	return errorf("InvalidInput", "Tagging is not supported for resources in shared namespace %s", nsID)
}
