package cloudmaplocal

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"
)

// defaultSOATTL is what the service sets when a DNS namespace is created
// without an SOA TTL.
const defaultSOATTL = 15

// resourceID accepts an id or the resource's ARN, as the service does.
func resourceID(idOrARN string) string {
	if strings.HasPrefix(idOrARN, "arn:") {
		return idOrARN[strings.LastIndexByte(idOrARN, '/')+1:]
	}
	return idOrARN
}

func (s *region) CreateHttpNamespace(ctx context.Context, in *CreateHttpNamespaceRequest) (*CreateHttpNamespaceResponse, error) {
	id, err := s.createNamespace(&namespaceRec{Name: in.Name, Type: "HTTP", Description: in.Description, Owner: callerFrom(ctx).account}, in.CreatorRequestId, in.Tags)
	if err != nil {
		return nil, err
	}
	return &CreateHttpNamespaceResponse{OperationId: id}, nil
}

func (s *region) CreatePrivateDnsNamespace(ctx context.Context, in *CreatePrivateDnsNamespaceRequest) (*CreatePrivateDnsNamespaceResponse, error) {
	ns := &namespaceRec{Name: in.Name, Type: "DNS_PRIVATE", Description: in.Description, Vpc: in.Vpc, Owner: callerFrom(ctx).account}
	if in.Properties != nil && in.Properties.DnsProperties != nil && in.Properties.DnsProperties.SOA != nil {
		ns.SOATTL = in.Properties.DnsProperties.SOA.TTL
	}
	id, err := s.createNamespace(ns, in.CreatorRequestId, in.Tags)
	if err != nil {
		return nil, err
	}
	return &CreatePrivateDnsNamespaceResponse{OperationId: id}, nil
}

func (s *region) CreatePublicDnsNamespace(ctx context.Context, in *CreatePublicDnsNamespaceRequest) (*CreatePublicDnsNamespaceResponse, error) {
	ns := &namespaceRec{Name: in.Name, Type: "DNS_PUBLIC", Description: in.Description, Owner: callerFrom(ctx).account}
	if in.Properties != nil && in.Properties.DnsProperties != nil && in.Properties.DnsProperties.SOA != nil {
		ns.SOATTL = in.Properties.DnsProperties.SOA.TTL
	}
	id, err := s.createNamespace(ns, in.CreatorRequestId, in.Tags)
	if err != nil {
		return nil, err
	}
	return &CreatePublicDnsNamespaceResponse{OperationId: id}, nil
}

func (s *region) createNamespace(ns *namespaceRec, creatorRequestID string, tags []Tag) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ""
	if creatorRequestID != "" {
		// A retried create (same CreatorRequestId) gets the first one's operation.
		key = "CreateNamespace/" + ns.Owner + "/" + creatorRequestID
		if opID, ok := s.st.Creators[key]; ok {
			return opID, nil
		}
	}
	if len(tags) > maxTagsPerResource {
		return "", tooManyTags(ns.Name)
	}
	ns.Name = strings.TrimSuffix(ns.Name, ".")
	ns.HttpName = ns.Name
	if id, taken := s.ix.nsByHTTPName[nameKey(ns.Owner, ns.HttpName)]; taken {
		e := errorf("NamespaceAlreadyExists", "Namespace with name %s already exists", ns.Name)
		e.Extra = map[string]any{"NamespaceId": id, "CreatorRequestId": s.st.Namespaces[id].CreatorRequestId}
		return "", e
	}
	// The namespace quota is the owner's, in each Region.
	owned := 0
	for _, other := range s.st.Namespaces {
		if other.Owner == ns.Owner {
			owned++
		}
	}
	for _, op := range s.st.Operations {
		if op.Pending != nil && op.Type == "CREATE_NAMESPACE" && op.Account == ns.Owner {
			if op.Pending.Namespace.HttpName == ns.HttpName {
				return "", duplicateRequest(op)
			}
			owned++
		}
	}
	if owned >= s.opts.MaxNamespaces {
		return "", errorf("ResourceLimitExceeded", "The namespace quota of %d is reached", s.opts.MaxNamespaces)
	}
	ns.Id = newNamespaceID()
	ns.Arn = s.arn(ns.Owner, "namespace", ns.Id)
	ns.CreateDate = time.Now()
	ns.CreatorRequestId = creatorRequestID
	if ns.Type != "HTTP" {
		ns.HostedZoneId = newHostedZoneID()
		if ns.SOATTL == nil {
			ttl := int64(defaultSOATTL)
			ns.SOATTL = &ttl
		}
	}
	if len(tags) > 0 {
		s.st.Tags[ns.Arn] = tags
	}
	op := s.startOperation(ns.Owner, ns, "CREATE_NAMESPACE", map[string]string{"NAMESPACE": ns.Id}, &pending{Namespace: ns}, key)
	return op.Id, nil
}

// namespaceOut renders a namespace; callers hold s.mu.
func (s *region) namespaceOut(ns *namespaceRec) *Namespace {
	count := int32(len(s.ix.svcByName[ns.Id]))
	if s.faults.get().StaleServiceCounts {
		count = 0 // as Cloud Map's count lags behind its services
	}
	props := &NamespaceProperties{HttpProperties: &HttpProperties{HttpName: ns.HttpName}}
	if ns.Type != "HTTP" {
		props.DnsProperties = &DnsProperties{HostedZoneId: ns.HostedZoneId, SOA: &SOA{TTL: ns.SOATTL}}
	}
	return &Namespace{
		Id: ns.Id, Arn: ns.Arn, ResourceOwner: ns.Owner, Name: ns.Name, Type: ns.Type, Description: ns.Description,
		ServiceCount: &count, Properties: props, CreateDate: ts(ns.CreateDate), CreatorRequestId: ns.CreatorRequestId,
	}
}

func (s *region) GetNamespace(ctx context.Context, in *GetNamespaceRequest) (*GetNamespaceResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns, err := s.namespace(in.Id, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	return &GetNamespaceResponse{Namespace: s.namespaceOut(ns)}, nil
}

func (s *region) ListNamespaces(ctx context.Context, in *ListNamespacesRequest) (*ListNamespacesResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	who := callerFrom(ctx).account
	spec := filterSpec{"TYPE": {"EQ", "IN", "BEGINS_WITH"}, "NAME": {"EQ", "BEGINS_WITH"}, "HTTP_NAME": {"EQ", "BEGINS_WITH"}, "RESOURCE_OWNER": {"EQ"}}
	type pred func(*namespaceRec) bool
	var preds []pred
	for _, f := range in.Filters {
		cond, err := checkFilter(spec, f.Name, f.Condition, f.Values)
		if err != nil {
			return nil, err
		}
		values, field := f.Values, f.Name
		preds = append(preds, func(ns *namespaceRec) bool {
			switch field {
			case "TYPE":
				return matchValue(cond, values, ns.Type)
			case "NAME":
				return matchValue(cond, values, ns.Name)
			case "RESOURCE_OWNER":
				return matchValue(cond, values, ownerValue(ns.Owner, who))
			default:
				return matchValue(cond, values, ns.HttpName)
			}
		})
	}
	keys := map[string]*namespaceRec{}
next:
	for _, ns := range s.st.Namespaces {
		if !s.visibleTo(ns, who) {
			continue
		}
		for _, p := range preds {
			if !p(ns) {
				continue next
			}
		}
		keys[pageKeyOldestFirst(ns.CreateDate, ns.Id)] = ns
	}
	page, token, err := paginate(slices.Sorted(maps.Keys(keys)), in.NextToken, in.MaxResults, 100)
	if err != nil {
		return nil, err
	}
	out := &ListNamespacesResponse{NextToken: token, Namespaces: []NamespaceSummary{}}
	for _, k := range page {
		n := s.namespaceOut(keys[k])
		out.Namespaces = append(out.Namespaces, NamespaceSummary{
			Id: n.Id, Arn: n.Arn, ResourceOwner: n.ResourceOwner, Name: n.Name, Type: n.Type, Description: n.Description,
			ServiceCount: n.ServiceCount, Properties: n.Properties, CreateDate: n.CreateDate,
		})
	}
	return out, nil
}

func (s *region) DeleteNamespace(ctx context.Context, in *DeleteNamespaceRequest) (*DeleteNamespaceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	ns, err := s.namespace(in.Id, who)
	if err != nil {
		return nil, err
	}
	if ns.Owner != who {
		return nil, accessDenied(who, "DeleteNamespace", ns.Arn)
	}
	if n := len(s.ix.svcByName[ns.Id]); n > 0 {
		return nil, errorf("ResourceInUse", "Namespace %s still has %d services", ns.Id, n)
	}
	if op := s.pendingOn(map[string]string{"NAMESPACE": ns.Id}); op != nil {
		return nil, duplicateRequest(op)
	}
	op := s.startOperation(who, ns, "DELETE_NAMESPACE", map[string]string{"NAMESPACE": ns.Id}, &pending{}, "")
	return &DeleteNamespaceResponse{OperationId: op.Id}, nil
}

// updateNamespace starts an UPDATE_NAMESPACE carrying the new description
// and SOA TTL. A retried update (same UpdaterRequestId) gets the first one's operation.
func (s *region) updateNamespace(who, idOrARN, wantType, updaterID string, change *namespaceRec) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ""
	if updaterID != "" {
		key = "UpdateNamespace/" + who + "/" + updaterID
		if opID, ok := s.st.Creators[key]; ok {
			return opID, nil
		}
	}
	ns, err := s.namespace(idOrARN, who)
	if err != nil {
		return "", err
	}
	if ns.Owner != who {
		return "", accessDenied(who, "UpdateNamespace", ns.Arn)
	}
	if ns.Type != wantType {
		return "", errorf("InvalidInput", "Namespace %s is of type %s, not %s", ns.Id, ns.Type, wantType)
	}
	if op := s.pendingOn(map[string]string{"NAMESPACE": ns.Id}); op != nil {
		return "", duplicateRequest(op)
	}
	op := s.startOperation(who, ns, "UPDATE_NAMESPACE", map[string]string{"NAMESPACE": ns.Id}, &pending{Namespace: change}, key)
	return op.Id, nil
}

func (s *region) UpdateHttpNamespace(ctx context.Context, in *UpdateHttpNamespaceRequest) (*UpdateHttpNamespaceResponse, error) {
	id, err := s.updateNamespace(callerFrom(ctx).account, in.Id, "HTTP", in.UpdaterRequestId, &namespaceRec{Description: in.Namespace.Description})
	if err != nil {
		return nil, err
	}
	return &UpdateHttpNamespaceResponse{OperationId: id}, nil
}

func (s *region) UpdatePrivateDnsNamespace(ctx context.Context, in *UpdatePrivateDnsNamespaceRequest) (*UpdatePrivateDnsNamespaceResponse, error) {
	change := &namespaceRec{Description: in.Namespace.Description}
	if p := in.Namespace.Properties; p != nil && p.DnsProperties != nil && p.DnsProperties.SOA != nil {
		change.SOATTL = p.DnsProperties.SOA.TTL
	}
	id, err := s.updateNamespace(callerFrom(ctx).account, in.Id, "DNS_PRIVATE", in.UpdaterRequestId, change)
	if err != nil {
		return nil, err
	}
	return &UpdatePrivateDnsNamespaceResponse{OperationId: id}, nil
}

func (s *region) UpdatePublicDnsNamespace(ctx context.Context, in *UpdatePublicDnsNamespaceRequest) (*UpdatePublicDnsNamespaceResponse, error) {
	change := &namespaceRec{Description: in.Namespace.Description}
	if p := in.Namespace.Properties; p != nil && p.DnsProperties != nil && p.DnsProperties.SOA != nil {
		change.SOATTL = p.DnsProperties.SOA.TTL
	}
	id, err := s.updateNamespace(callerFrom(ctx).account, in.Id, "DNS_PUBLIC", in.UpdaterRequestId, change)
	if err != nil {
		return nil, err
	}
	return &UpdatePublicDnsNamespaceResponse{OperationId: id}, nil
}

// ownerValue is what a RESOURCE_OWNER filter compares: SELF or OTHER_ACCOUNTS.
func ownerValue(owner, who string) string {
	if owner == who {
		return "SELF"
	}
	return "OTHER_ACCOUNTS"
}

func tooManyTags(resource string) *apiError {
	e := errorf("TooManyTagsException", "A resource can have at most %d tags", maxTagsPerResource)
	e.Extra = map[string]any{"ResourceName": resource}
	return e
}
