package cloudmaplocal

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"
)

func (s *region) CreateService(ctx context.Context, in *CreateServiceRequest) (*CreateServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	nsID := in.NamespaceId
	if nsID == "" && in.DnsConfig != nil {
		nsID = in.DnsConfig.NamespaceId // the deprecated place for it
	}
	if nsID == "" {
		return nil, errorf("InvalidInput", "NamespaceId is required")
	}
	ns, err := s.namespace(nsID, who)
	if err != nil {
		return nil, err
	}
	// Service names are unique in a namespace, whichever account made them.
	if id, taken := s.ix.svcByName[ns.Id][in.Name]; taken {
		existing := s.st.Services[id]
		if in.CreatorRequestId != "" && existing.CreatorRequestId == in.CreatorRequestId && existing.CreatedBy == who {
			return &CreateServiceResponse{Service: s.serviceOut(existing)}, nil // a retry
		}
		e := errorf("ServiceAlreadyExists", "Service %s already exists in namespace %s", in.Name, ns.Id)
		e.Extra = map[string]any{"ServiceId": id, "ServiceArn": existing.Arn, "CreatorRequestId": existing.CreatorRequestId}
		return nil, e
	}
	if len(in.Tags) > maxTagsPerResource {
		return nil, tooManyTags(in.Name)
	}
	if len(in.Tags) > 0 && s.shared(ns.Id) {
		return nil, untaggable(ns.Id)
	}
	svc := &serviceRec{
		Id: newServiceID(), Name: in.Name, NamespaceId: ns.Id, Description: in.Description,
		HealthCheckConfig: in.HealthCheckConfig, HealthCheckCustomConfig: in.HealthCheckCustomConfig,
		CreateDate: time.Now(), CreatorRequestId: in.CreatorRequestId, CreatedBy: who, Instances: map[string]*instanceRec{},
	}
	// A service carries its namespace owner's account in its ARN.
	svc.Arn = s.arn(ns.Owner, "service", svc.Id)
	switch {
	case ns.Type == "HTTP":
		if in.DnsConfig != nil {
			return nil, errorf("InvalidInput", "DnsConfig is not allowed for services in HTTP namespace %s", ns.Id)
		}
		svc.Type = "HTTP"
	case in.Type == "HTTP":
		if in.DnsConfig != nil {
			return nil, errorf("InvalidInput", "DnsConfig is not allowed for services of type HTTP")
		}
		svc.Type = "HTTP"
	default:
		if in.DnsConfig == nil {
			return nil, errorf("InvalidInput", "DnsConfig is required for services in DNS namespace %s", ns.Id)
		}
		if err := checkDNSConfig(in.DnsConfig); err != nil {
			return nil, err
		}
		dc := *in.DnsConfig
		dc.NamespaceId = ns.Id
		if dc.RoutingPolicy == "" {
			dc.RoutingPolicy = "MULTIVALUE"
		}
		svc.DnsConfig, svc.Type = &dc, "DNS_HTTP"
	}
	if in.HealthCheckConfig != nil && in.HealthCheckCustomConfig != nil {
		return nil, errorf("InvalidInput", "HealthCheckConfig and HealthCheckCustomConfig cannot both be set")
	}
	if in.HealthCheckConfig != nil && ns.Type != "DNS_PUBLIC" {
		return nil, errorf("InvalidInput", "HealthCheckConfig is only supported in public DNS namespaces")
	}
	if len(in.Tags) > 0 {
		s.st.Tags[svc.Arn] = in.Tags
	}
	s.st.Services[svc.Id] = svc
	s.ix.svcByName[ns.Id][svc.Name] = svc.Id
	s.changed()
	return &CreateServiceResponse{Service: s.serviceOut(svc)}, nil
}

// checkDNSConfig applies the service's rules on record sets: one record per
// type, CNAME alone and only with WEIGHTED routing.
func checkDNSConfig(dc *DnsConfig) error {
	seen := map[string]bool{}
	for _, r := range dc.DnsRecords {
		if seen[r.Type] {
			return errorf("InvalidInput", "DnsRecords has more than one %s record", r.Type)
		}
		seen[r.Type] = true
	}
	if seen["CNAME"] && (len(dc.DnsRecords) > 1 || dc.RoutingPolicy == "MULTIVALUE") {
		return errorf("InvalidInput", "A CNAME record cannot be combined with other records or MULTIVALUE routing")
	}
	return nil
}

func (s *region) serviceOut(svc *serviceRec) *Service {
	count := int32(len(svc.Instances))
	return &Service{
		Id: svc.Id, Arn: svc.Arn, ResourceOwner: s.st.Namespaces[svc.NamespaceId].Owner, CreatedByAccount: svc.CreatedBy, Name: svc.Name, NamespaceId: svc.NamespaceId, Description: svc.Description,
		InstanceCount: &count, DnsConfig: svc.DnsConfig, Type: svc.Type, HealthCheckConfig: svc.HealthCheckConfig,
		HealthCheckCustomConfig: svc.HealthCheckCustomConfig, CreateDate: ts(svc.CreateDate), CreatorRequestId: svc.CreatorRequestId,
	}
}

func (s *region) GetService(ctx context.Context, in *GetServiceRequest) (*GetServiceResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, _, err := s.service(in.Id, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	return &GetServiceResponse{Service: s.serviceOut(svc)}, nil
}

// ListServices lists the services of every namespace the caller may use,
// or of those the NAMESPACE_ID filter names (another account's by ARN).
func (s *region) ListServices(ctx context.Context, in *ListServicesRequest) (*ListServicesResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	who := callerFrom(ctx).account
	var nsIDs []string
	owner := ""
	for _, f := range in.Filters {
		if _, err := checkFilter(filterSpec{"NAMESPACE_ID": {"EQ", "IN"}, "RESOURCE_OWNER": {"EQ"}}, f.Name, f.Condition, f.Values); err != nil {
			return nil, err
		}
		if f.Name == "RESOURCE_OWNER" {
			owner = f.Values[0]
			continue
		}
		nsIDs = f.Values
	}
	var namespaces []*namespaceRec
	if nsIDs == nil {
		for _, ns := range s.st.Namespaces {
			if s.visibleTo(ns, who) {
				namespaces = append(namespaces, ns)
			}
		}
	}
	for _, id := range nsIDs {
		if ns, err := s.namespace(id, who); err == nil {
			namespaces = append(namespaces, ns)
		}
	}
	keys := map[string]*serviceRec{}
	for _, ns := range namespaces {
		if owner != "" && ownerValue(ns.Owner, who) != owner {
			continue
		}
		for _, id := range s.ix.svcByName[ns.Id] {
			svc := s.st.Services[id]
			keys[pageKeyOldestFirst(svc.CreateDate, svc.Id)] = svc
		}
	}
	page, token, err := paginate(slices.Sorted(maps.Keys(keys)), in.NextToken, in.MaxResults, 100)
	if err != nil {
		return nil, err
	}
	out := &ListServicesResponse{NextToken: token, Services: []ServiceSummary{}}
	for _, k := range page {
		v := s.serviceOut(keys[k])
		out.Services = append(out.Services, ServiceSummary{
			Id: v.Id, Arn: v.Arn, ResourceOwner: v.ResourceOwner, CreatedByAccount: v.CreatedByAccount, Name: v.Name, Type: v.Type, Description: v.Description, InstanceCount: v.InstanceCount,
			DnsConfig: v.DnsConfig, HealthCheckConfig: v.HealthCheckConfig, HealthCheckCustomConfig: v.HealthCheckCustomConfig,
			CreateDate: v.CreateDate,
		})
	}
	return out, nil
}

func (s *region) UpdateService(ctx context.Context, in *UpdateServiceRequest) (*UpdateServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.Id, who)
	if err != nil {
		return nil, err
	}
	if !s.mayChange(ns, svc.CreatedBy, who) {
		return nil, accessDenied(who, "UpdateService", svc.Arn)
	}
	if s.shared(ns.Id) {
		for _, inst := range svc.Instances {
			if inst.CreatedBy != who {
				return nil, errorf("InvalidInput", "Service %s is in a shared namespace and holds instances other accounts registered", svc.Id)
			}
		}
	}
	if c := in.Service.DnsConfig; c != nil {
		if svc.DnsConfig == nil {
			return nil, errorf("InvalidInput", "Service %s has no DNS configuration to change", svc.Id)
		}
		// Only the TTLs of the existing record types may change.
		if len(c.DnsRecords) != len(svc.DnsConfig.DnsRecords) {
			return nil, errorf("InvalidInput", "DnsRecords must list the service's record types %s", recordTypes(svc.DnsConfig))
		}
		for _, r := range c.DnsRecords {
			if !strings.Contains(recordTypes(svc.DnsConfig), r.Type) {
				return nil, errorf("InvalidInput", "DnsRecords must list the service's record types %s", recordTypes(svc.DnsConfig))
			}
		}
	}
	if in.Service.HealthCheckConfig != nil && svc.HealthCheckConfig == nil {
		return nil, errorf("InvalidInput", "Service %s has no HealthCheckConfig to change", svc.Id)
	}
	if op := s.pendingOn(map[string]string{"SERVICE": svc.Id}); op != nil && op.Type == "UPDATE_SERVICE" {
		return nil, duplicateRequest(op)
	}
	op := s.startOperation(who, ns, "UPDATE_SERVICE", map[string]string{"SERVICE": svc.Id}, &pending{ServiceDiff: in.Service}, "")
	return &UpdateServiceResponse{OperationId: op.Id}, nil
}

func recordTypes(dc *DnsConfig) string {
	var t []string
	for _, r := range dc.DnsRecords {
		t = append(t, r.Type)
	}
	return strings.Join(t, ",")
}

func applyServiceChange(svc *serviceRec, c *ServiceChange) {
	if c.Description != "" {
		svc.Description = c.Description
	}
	if c.DnsConfig != nil && svc.DnsConfig != nil {
		dc := *svc.DnsConfig
		dc.DnsRecords = c.DnsConfig.DnsRecords
		svc.DnsConfig = &dc
	}
	if c.HealthCheckConfig != nil {
		svc.HealthCheckConfig = c.HealthCheckConfig
	}
}

func (s *region) DeleteService(ctx context.Context, in *DeleteServiceRequest) (*DeleteServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.Id, who)
	if err != nil {
		return nil, err
	}
	if !s.mayChange(ns, svc.CreatedBy, who) {
		return nil, accessDenied(who, "DeleteService", svc.Arn)
	}
	if n := len(svc.Instances); n > 0 {
		return nil, errorf("ResourceInUse", "Service %s still has %d registered instances", svc.Id, n)
	}
	if op := s.pendingOn(map[string]string{"SERVICE": svc.Id}); op != nil && op.Type == "REGISTER_INSTANCE" {
		return nil, errorf("ResourceInUse", "Service %s has an instance registration in progress", svc.Id)
	}
	delete(s.st.Services, svc.Id)
	delete(s.st.Tags, svc.Arn)
	delete(s.ix.svcByName[svc.NamespaceId], svc.Name)
	s.changed()
	return &DeleteServiceResponse{}, nil
}

func (s *region) GetServiceAttributes(ctx context.Context, in *GetServiceAttributesRequest) (*GetServiceAttributesResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ns, err := s.service(in.ServiceId, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	attrs := maps.Clone(svc.Attributes)
	if attrs == nil {
		attrs = map[string]string{}
	}
	return &GetServiceAttributesResponse{ServiceAttributes: &ServiceAttributes{ServiceArn: svc.Arn, ResourceOwner: ns.Owner, Attributes: attrs}}, nil
}

func (s *region) UpdateServiceAttributes(ctx context.Context, in *UpdateServiceAttributesRequest) (*UpdateServiceAttributesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.ServiceId, who)
	if err != nil {
		return nil, err
	}
	if !s.mayChange(ns, svc.CreatedBy, who) {
		return nil, accessDenied(who, "UpdateServiceAttributes", svc.Arn)
	}
	merged := map[string]string{}
	maps.Copy(merged, svc.Attributes)
	maps.Copy(merged, in.Attributes)
	if len(merged) > maxServiceAttributes {
		return nil, errorf("ServiceAttributesLimitExceededException", "A service can have at most %d attributes", maxServiceAttributes)
	}
	svc.Attributes = merged
	s.changed()
	return &UpdateServiceAttributesResponse{}, nil
}

func (s *region) DeleteServiceAttributes(ctx context.Context, in *DeleteServiceAttributesRequest) (*DeleteServiceAttributesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.ServiceId, who)
	if err != nil {
		return nil, err
	}
	if !s.mayChange(ns, svc.CreatedBy, who) {
		return nil, accessDenied(who, "DeleteServiceAttributes", svc.Arn)
	}
	for _, k := range in.Attributes {
		delete(svc.Attributes, k)
	}
	s.changed()
	return &DeleteServiceAttributesResponse{}, nil
}

// taggable finds the ARN of an existing namespace or service who may tag:
// anything in a namespace it owns that is not shared; writing says
// whether the call changes tags (an owner may still read and remove the
// tags a namespace had before it was shared).
func (s *region) taggable(arn, who string, writing bool) error {
	id := resourceID(arn)
	var ns *namespaceRec
	if n := s.st.Namespaces[id]; n != nil && n.Arn == arn {
		ns = n
	} else if svc := s.st.Services[id]; svc != nil && svc.Arn == arn {
		ns = s.st.Namespaces[svc.NamespaceId]
	}
	switch {
	case ns == nil || !s.visibleTo(ns, who):
		return errorf("ResourceNotFoundException", "Resource %s not found", arn)
	case ns.Owner != who || writing && s.shared(ns.Id):
		return untaggable(ns.Id)
	}
	return nil
}

func (s *region) ListTagsForResource(ctx context.Context, in *ListTagsForResourceRequest) (*ListTagsForResourceResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.taggable(in.ResourceARN, callerFrom(ctx).account, false); err != nil {
		return nil, err
	}
	return &ListTagsForResourceResponse{Tags: append([]Tag{}, s.st.Tags[in.ResourceARN]...)}, nil
}

func (s *region) TagResource(ctx context.Context, in *TagResourceRequest) (*TagResourceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.taggable(in.ResourceARN, callerFrom(ctx).account, true); err != nil {
		return nil, err
	}
	tags := append([]Tag{}, s.st.Tags[in.ResourceARN]...)
	for _, t := range in.Tags {
		replaced := false
		for i := range tags {
			if tags[i].Key == t.Key {
				tags[i].Value, replaced = t.Value, true
			}
		}
		if !replaced {
			tags = append(tags, t)
		}
	}
	if len(tags) > maxTagsPerResource {
		return nil, tooManyTags(in.ResourceARN)
	}
	s.st.Tags[in.ResourceARN] = tags
	s.changed()
	return &TagResourceResponse{}, nil
}

func (s *region) UntagResource(ctx context.Context, in *UntagResourceRequest) (*UntagResourceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.taggable(in.ResourceARN, callerFrom(ctx).account, false); err != nil {
		return nil, err
	}
	var kept []Tag
	for _, t := range s.st.Tags[in.ResourceARN] {
		if !slices.Contains(in.TagKeys, t.Key) {
			kept = append(kept, t)
		}
	}
	s.st.Tags[in.ResourceARN] = kept
	s.changed()
	return &UntagResourceResponse{}, nil
}
