package cloudmaplocal

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Attributes the service reserves; they do not count as custom attributes.
var reservedAttributes = map[string]bool{
	"AWS_INSTANCE_IPV4": true, "AWS_INSTANCE_IPV6": true, "AWS_INSTANCE_PORT": true,
	"AWS_INSTANCE_CNAME": true, "AWS_ALIAS_DNS_NAME": true, "AWS_EC2_INSTANCE_ID": true,
	"AWS_INIT_HEALTH_STATUS": true,
}

// checkAttributes applies the attribute quotas and the attributes the
// service's DNS records need.
func checkAttributes(svc *serviceRec, attrs map[string]string) error {
	custom, total := 0, 0
	for k, v := range attrs {
		total += len(k) + len(v)
		if !reservedAttributes[k] {
			custom++
		}
	}
	if custom > maxCustomAttributes {
		return errorf("InvalidInput", "An instance can have at most %d custom attributes, got %d", maxCustomAttributes, custom)
	}
	if total > maxAttributesLength {
		return errorf("InvalidInput", "Attribute keys and values can total at most %d characters, got %d", maxAttributesLength, total)
	}
	if v, ok := attrs["AWS_INSTANCE_IPV4"]; ok {
		if a, err := netip.ParseAddr(v); err != nil || !a.Is4() {
			return errorf("InvalidInput", "AWS_INSTANCE_IPV4 %q is not an IPv4 address", v)
		}
	}
	if v, ok := attrs["AWS_INSTANCE_IPV6"]; ok {
		if a, err := netip.ParseAddr(v); err != nil || !a.Is6() || a.Is4In6() {
			return errorf("InvalidInput", "AWS_INSTANCE_IPV6 %q is not an IPv6 address", v)
		}
	}
	if v, ok := attrs["AWS_INSTANCE_PORT"]; ok {
		if p, err := strconv.Atoi(v); err != nil || p < 0 || p > 65535 {
			return errorf("InvalidInput", "AWS_INSTANCE_PORT %q is not a port number", v)
		}
	}
	if v, ok := attrs["AWS_INIT_HEALTH_STATUS"]; ok && v != "HEALTHY" && v != "UNHEALTHY" {
		return errorf("InvalidInput", "AWS_INIT_HEALTH_STATUS must be HEALTHY or UNHEALTHY, got %q", v)
	}
	if svc.DnsConfig == nil {
		return nil
	}
	_, alias := attrs["AWS_ALIAS_DNS_NAME"]
	_, v4 := attrs["AWS_INSTANCE_IPV4"]
	_, v6 := attrs["AWS_INSTANCE_IPV6"]
	for _, r := range svc.DnsConfig.DnsRecords {
		var missing string
		switch r.Type {
		case "A":
			if !v4 && !alias {
				missing = "AWS_INSTANCE_IPV4"
			}
		case "AAAA":
			if !v6 && !alias {
				missing = "AWS_INSTANCE_IPV6"
			}
		case "SRV":
			if _, ok := attrs["AWS_INSTANCE_PORT"]; !ok {
				missing = "AWS_INSTANCE_PORT"
			} else if !v4 && !v6 {
				missing = "AWS_INSTANCE_IPV4 or AWS_INSTANCE_IPV6"
			}
		case "CNAME":
			if _, ok := attrs["AWS_INSTANCE_CNAME"]; !ok {
				missing = "AWS_INSTANCE_CNAME"
			}
		}
		if missing != "" {
			return errorf("InvalidInput", "Service %s has a %s record, so instances need %s", svc.Id, r.Type, missing)
		}
	}
	return nil
}

// checkInstanceQuota is the check before a new instance id; callers hold s.mu.
func (s *region) checkInstanceQuota(svc *serviceRec) *apiError {
	if len(svc.Instances) >= maxInstancesPerService {
		return errorf("ResourceLimitExceeded", "Service %s has reached the quota of %d instances", svc.Id, maxInstancesPerService)
	}
	if s.ix.nsInstances[svc.NamespaceId] >= s.opts.MaxInstancesPerNamespace {
		return errorf("ResourceLimitExceeded", "Namespace %s has reached the quota of %d instances", svc.NamespaceId, s.opts.MaxInstancesPerNamespace)
	}
	return nil
}

// RegisterInstance lets any account that may use the namespace register
// into any of its services; re-registering an instance is for whoever
// registered it or the namespace's owner (strict reading).
func (s *region) RegisterInstance(ctx context.Context, in *RegisterInstanceRequest) (*RegisterInstanceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.ServiceId, who)
	if err != nil {
		return nil, err
	}
	key := ""
	if in.CreatorRequestId != "" {
		key = "RegisterInstance/" + who + "/" + svc.Id + "/" + in.CreatorRequestId
		if opID, ok := s.st.Creators[key]; ok {
			return &RegisterInstanceResponse{OperationId: opID}, nil // a retry
		}
	}
	if op := s.pendingOn(map[string]string{"SERVICE": svc.Id, "INSTANCE": in.InstanceId}); op != nil {
		return nil, duplicateRequest(op)
	}
	if err := checkAttributes(svc, in.Attributes); err != nil {
		return nil, err
	}
	if existing, exists := svc.Instances[in.InstanceId]; !exists {
		if err := s.checkInstanceQuota(svc); err != nil {
			return nil, err
		}
	} else if !s.mayChange(ns, existing.CreatedBy, who) {
		return nil, accessDenied(who, "RegisterInstance", svc.Arn+"/"+in.InstanceId)
	}
	health := "HEALTHY"
	if in.Attributes["AWS_INIT_HEALTH_STATUS"] == "UNHEALTHY" {
		health = "UNHEALTHY"
	}
	inst := &instanceRec{Id: in.InstanceId, CreatorRequestId: in.CreatorRequestId, Attributes: maps.Clone(in.Attributes), Health: health, CreatedBy: who}
	op := s.startOperation(who, ns, "REGISTER_INSTANCE",
		map[string]string{"NAMESPACE": svc.NamespaceId, "SERVICE": svc.Id, "INSTANCE": in.InstanceId},
		&pending{Instance: inst, ServiceId: svc.Id}, key)
	return &RegisterInstanceResponse{OperationId: op.Id}, nil
}

func (s *region) DeregisterInstance(ctx context.Context, in *DeregisterInstanceRequest) (*DeregisterInstanceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, err := s.service(in.ServiceId, who)
	if err != nil {
		return nil, err
	}
	if op := s.pendingOn(map[string]string{"SERVICE": svc.Id, "INSTANCE": in.InstanceId}); op != nil {
		return nil, duplicateRequest(op)
	}
	inst := svc.Instances[in.InstanceId]
	if inst == nil {
		return nil, errorf("InstanceNotFound", "Instance %s not found in service %s", in.InstanceId, svc.Id)
	}
	if !s.mayChange(ns, inst.CreatedBy, who) {
		return nil, accessDenied(who, "DeregisterInstance", svc.Arn+"/"+in.InstanceId)
	}
	op := s.startOperation(who, ns, "DEREGISTER_INSTANCE",
		map[string]string{"NAMESPACE": svc.NamespaceId, "SERVICE": svc.Id, "INSTANCE": in.InstanceId}, &pending{}, "")
	return &DeregisterInstanceResponse{OperationId: op.Id}, nil
}

func (s *region) instance(serviceID, instanceID, who string) (*serviceRec, *namespaceRec, *instanceRec, error) {
	svc, ns, err := s.service(serviceID, who)
	if err != nil {
		return nil, nil, nil, err
	}
	inst := svc.Instances[instanceID]
	if inst == nil {
		return nil, nil, nil, errorf("InstanceNotFound", "Instance %s not found in service %s", instanceID, svc.Id)
	}
	return svc, ns, inst, nil
}

func (s *region) GetInstance(ctx context.Context, in *GetInstanceRequest) (*GetInstanceResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ns, inst, err := s.instance(in.ServiceId, in.InstanceId, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	return &GetInstanceResponse{ResourceOwner: ns.Owner, Instance: &Instance{
		Id: inst.Id, CreatorRequestId: inst.CreatorRequestId, Attributes: inst.Attributes, CreatedByAccount: inst.CreatedBy,
	}}, nil
}

func (s *region) ListInstances(ctx context.Context, in *ListInstancesRequest) (*ListInstancesResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ns, err := s.service(in.ServiceId, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	page, token, err := paginate(slices.Sorted(maps.Keys(svc.Instances)), in.NextToken, in.MaxResults, 100)
	if err != nil {
		return nil, err
	}
	out := &ListInstancesResponse{ResourceOwner: ns.Owner, NextToken: token, Instances: make([]InstanceSummary, 0, len(page))}
	for _, id := range page {
		inst := svc.Instances[id]
		out.Instances = append(out.Instances, InstanceSummary{Id: id, Attributes: inst.Attributes, CreatedByAccount: inst.CreatedBy})
	}
	return out, nil
}

// discoverable finds a service by namespace HttpName and service name in
// the caller's own namespaces or, given an OwnerAccount, in that
// account's namespace shared with the caller; callers hold s.mu.
func (s *region) discoverable(who, owner, namespaceName, serviceName string) (*namespaceRec, *serviceRec, error) {
	if owner == "" {
		owner = who
	}
	nsID, ok := s.ix.nsByHTTPName[nameKey(owner, namespaceName)]
	if !ok || !s.visibleTo(s.st.Namespaces[nsID], who) {
		return nil, nil, errorf("NamespaceNotFound", "Namespace %s not found", namespaceName)
	}
	svcID, ok := s.ix.svcByName[nsID][serviceName]
	if !ok {
		return nil, nil, errorf("ServiceNotFound", "Service %s not found in namespace %s", serviceName, namespaceName)
	}
	return s.st.Namespaces[nsID], s.st.Services[svcID], nil
}

func hasHealthCheck(svc *serviceRec) bool {
	return svc.HealthCheckConfig != nil || svc.HealthCheckCustomConfig != nil
}

func matchesAll(attrs, filter map[string]string) bool {
	for k, v := range filter {
		if attrs[k] != v {
			return false
		}
	}
	return true
}

// record keeps what a change of instance id replaces, for the reads that
// lag (Profile.ReadLag); callers hold s.mu for writing and change
// svc.Instances[id] and the revision right after.
func (s *region) record(svc *serviceRec, id string) {
	now := time.Now()
	if s.profile.ReadLag <= 0 {
		return
	}
	drop := 0
	for drop < len(svc.history) && now.Sub(svc.history[drop].at) > s.profile.ReadLag {
		drop++
	}
	svc.history = append(svc.history[drop:], instanceChange{at: now, id: id, prev: svc.Instances[id], prevRevision: svc.Revision})
}

// seen is a service's instances and revision as one data-plane read shows
// them: as they were at a moment drawn from the last ReadLag. Callers hold
// s.mu; the map returned is not to be changed.
func (s *region) seen(svc *serviceRec) (map[string]*instanceRec, int64) {
	if s.profile.ReadLag <= 0 || len(svc.history) == 0 {
		return svc.Instances, svc.Revision
	}
	at := time.Now().Add(-rand.N(s.profile.ReadLag))
	if !svc.history[len(svc.history)-1].at.After(at) {
		return svc.Instances, svc.Revision
	}
	instances, rev := maps.Clone(svc.Instances), svc.Revision
	for i := len(svc.history) - 1; i >= 0 && svc.history[i].at.After(at); i-- {
		c := svc.history[i]
		if c.prev == nil {
			delete(instances, c.id)
		} else {
			instances[c.id] = c.prev
		}
		rev = c.prevRevision
	}
	return instances, rev
}

func (s *region) DiscoverInstances(ctx context.Context, in *DiscoverInstancesRequest) (*DiscoverInstancesResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns, svc, err := s.discoverable(callerFrom(ctx).account, in.OwnerAccount, in.NamespaceName, in.ServiceName)
	if err != nil {
		return nil, err
	}
	instances, rev := s.seen(svc)
	// Health only filters services that have a health check. Without a
	// HealthStatus, HEALTHY is assumed (the model documents no default).
	want := in.HealthStatus
	if want == "" {
		want = "HEALTHY"
	}
	var matched []*instanceRec
	for _, inst := range instances {
		if matchesAll(inst.Attributes, in.QueryParameters) {
			matched = append(matched, inst)
		}
	}
	if len(in.OptionalParameters) > 0 {
		var opt []*instanceRec
		for _, inst := range matched {
			if matchesAll(inst.Attributes, in.OptionalParameters) {
				opt = append(opt, inst)
			}
		}
		if len(opt) > 0 {
			matched = opt
		}
	}
	if hasHealthCheck(svc) && want != "ALL" {
		byHealth := func(h string) []*instanceRec {
			var out []*instanceRec
			for _, inst := range matched {
				if inst.Health == h {
					out = append(out, inst)
				}
			}
			return out
		}
		switch want {
		case "HEALTHY", "UNHEALTHY":
			matched = byHealth(want)
		case "HEALTHY_OR_ELSE_ALL":
			if healthy := byHealth("HEALTHY"); len(healthy) > 0 {
				matched = healthy
			}
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].Id < matched[j].Id })
	limit := 100
	if in.MaxResults != nil {
		limit = int(*in.MaxResults)
	}
	if len(matched) > limit {
		matched = matched[:limit]
	}
	out := &DiscoverInstancesResponse{InstancesRevision: &rev, Instances: make([]HttpInstanceSummary, 0, len(matched))}
	for _, inst := range matched {
		health := inst.Health
		if !hasHealthCheck(svc) {
			health = "UNKNOWN"
		}
		out.Instances = append(out.Instances, HttpInstanceSummary{
			InstanceId: inst.Id, NamespaceName: ns.HttpName, ServiceName: svc.Name,
			HealthStatus: health, Attributes: inst.Attributes,
		})
	}
	return out, nil
}

func (s *region) DiscoverInstancesRevision(ctx context.Context, in *DiscoverInstancesRevisionRequest) (*DiscoverInstancesRevisionResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, svc, err := s.discoverable(callerFrom(ctx).account, in.OwnerAccount, in.NamespaceName, in.ServiceName)
	if err != nil {
		return nil, err
	}
	_, rev := s.seen(svc)
	return &DiscoverInstancesRevisionResponse{InstancesRevision: &rev}, nil
}

func (s *region) GetInstancesHealthStatus(ctx context.Context, in *GetInstancesHealthStatusRequest) (*GetInstancesHealthStatusResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, _, err := s.service(in.ServiceId, callerFrom(ctx).account)
	if err != nil {
		return nil, err
	}
	ids := in.Instances
	if len(ids) == 0 {
		ids = slices.Sorted(maps.Keys(svc.Instances))
	} else {
		ids = append([]string{}, ids...)
		sort.Strings(ids)
		for _, id := range ids {
			if svc.Instances[id] == nil {
				return nil, errorf("InstanceNotFound", "Instance %s not found in service %s", id, svc.Id)
			}
		}
	}
	page, token, err := paginate(ids, in.NextToken, in.MaxResults, 100)
	if err != nil {
		return nil, err
	}
	out := &GetInstancesHealthStatusResponse{NextToken: token, Status: map[string]string{}}
	for _, id := range page {
		h := svc.Instances[id].Health
		if !hasHealthCheck(svc) {
			h = "UNKNOWN"
		}
		out.Status[id] = h
	}
	return out, nil
}

func (s *region) UpdateInstanceCustomHealthStatus(ctx context.Context, in *UpdateInstanceCustomHealthStatusRequest) (*Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := callerFrom(ctx).account
	svc, ns, inst, err := s.instance(in.ServiceId, in.InstanceId, who)
	if err != nil {
		return nil, err
	}
	if !s.mayChange(ns, inst.CreatedBy, who) {
		return nil, accessDenied(who, "UpdateInstanceCustomHealthStatus", svc.Arn+"/"+inst.Id)
	}
	if svc.HealthCheckCustomConfig == nil {
		return nil, errorf("CustomHealthNotFound", "Service %s has no custom health check", svc.Id)
	}
	if inst.Health != in.Status {
		s.record(svc, inst.Id)
		changed := *inst
		changed.Health = in.Status
		svc.Instances[inst.Id] = &changed
		// What DiscoverInstances returns changed: so does the revision.
		svc.Revision++
		s.changed()
	}
	return &Empty{}, nil
}
