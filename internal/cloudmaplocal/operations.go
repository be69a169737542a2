package cloudmaplocal

import (
	"context"
	"math/rand/v2"
	"time"
)

// Asynchronous operations: namespace create/update/delete, UpdateService and
// instance (de)registration answer with an OperationId at once; the change
// itself happens when the operation completes, the profile's OperationTime
// later.

// startOperation records account's operation on ns and, when the profile
// gives it no time, completes it before returning. Callers hold s.mu.
func (s *region) startOperation(account string, ns *namespaceRec, opType string, targets map[string]string, p *pending, creatorKey string) *operationRec {
	now := time.Now()
	op := &operationRec{
		Id: newOperationID(), Type: opType, Status: "SUBMITTED", Account: account, Owner: ns.Owner,
		CreateDate: now, UpdateDate: now, Targets: targets, Pending: p, CreatorKey: creatorKey,
	}
	s.st.Operations[op.Id] = op
	s.ix.addOperation(op)
	if creatorKey != "" {
		s.st.Creators[creatorKey] = op.Id
	}
	s.changed()
	d := s.profile.OperationTime.draw()
	if d <= 0 {
		s.complete(op)
		return op
	}
	op.DueAt = now.Add(d)
	s.pending[op.Id] = op
	s.schedule(op)
	return op
}

// schedule completes op when it is due. Callers hold s.mu.
func (s *region) schedule(op *operationRec) {
	s.timers[op.Id] = time.AfterFunc(max(time.Until(op.DueAt), 0), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.timers, op.Id)
		if op.Pending != nil {
			s.complete(op)
		}
	})
}

// complete applies an operation, or fails it. Callers hold s.mu.
func (s *region) complete(op *operationRec) {
	op.Status = "SUCCESS"
	if s.failOperation() {
		op.Status, op.ErrorCode, op.ErrorMessage = "FAIL", "INTERNAL_FAILURE", "The operation failed (injected failure)"
	} else if err := s.apply(op); err != nil {
		op.Status, op.ErrorCode, op.ErrorMessage = "FAIL", err.Code, err.Message
	}
	op.Pending = nil
	op.DueAt = time.Time{}
	delete(s.pending, op.Id)
	op.UpdateDate = time.Now()
	s.finished = append(s.finished, op.Id)
	s.prune()
	s.changed()
}

// prune forgets the oldest finished operations past MaxOperations, and
// the idempotency keys that named them; in batches of a tenth, so that the
// copy is paid once per many operations. Callers hold s.mu.
func (s *region) prune() {
	if len(s.finished) <= s.opts.MaxOperations+s.opts.MaxOperations/10 {
		return
	}
	n := len(s.finished) - s.opts.MaxOperations
	for _, id := range s.finished[:n] {
		if op := s.st.Operations[id]; op != nil {
			delete(s.st.Operations, id)
			if op.CreatorKey != "" && s.st.Creators[op.CreatorKey] == id {
				delete(s.st.Creators, op.CreatorKey)
			}
		}
	}
	// A fresh array, so that the pruned ids do not stay referenced.
	s.finished = append([]string(nil), s.finished[n:]...)
	s.ix.dropOperations(s.st)
}

func (s *region) apply(op *operationRec) *apiError {
	p := op.Pending
	switch op.Type {
	case "CREATE_NAMESPACE":
		ns := p.Namespace
		if other, taken := s.ix.nsByHTTPName[nameKey(ns.Owner, ns.HttpName)]; taken && other != ns.Id {
			return errorf("NamespaceAlreadyExists", "Namespace %s already exists", ns.Name)
		}
		s.st.Namespaces[ns.Id] = ns
		s.ix.nsByHTTPName[nameKey(ns.Owner, ns.HttpName)] = ns.Id
		s.ix.svcByName[ns.Id] = map[string]string{}
	case "DELETE_NAMESPACE":
		id := op.Targets["NAMESPACE"]
		ns := s.st.Namespaces[id]
		if ns == nil {
			return errorf("NamespaceNotFound", "Namespace %s not found", id)
		}
		if len(s.ix.svcByName[id]) > 0 {
			return errorf("ResourceInUse", "Namespace %s has services", id)
		}
		delete(s.st.Namespaces, id)
		delete(s.st.Tags, ns.Arn)
		delete(s.st.Shares, id)
		delete(s.ix.nsByHTTPName, nameKey(ns.Owner, ns.HttpName))
		delete(s.ix.svcByName, id)
		delete(s.ix.nsInstances, id)
	case "UPDATE_NAMESPACE":
		ns := s.st.Namespaces[op.Targets["NAMESPACE"]]
		if ns == nil {
			return errorf("NamespaceNotFound", "Namespace %s not found", op.Targets["NAMESPACE"])
		}
		if p.Namespace.Description != "" {
			ns.Description = p.Namespace.Description
		}
		if p.Namespace.SOATTL != nil {
			ns.SOATTL = p.Namespace.SOATTL
		}
	case "UPDATE_SERVICE":
		svc := s.st.Services[op.Targets["SERVICE"]]
		if svc == nil {
			return errorf("ServiceNotFound", "Service %s not found", op.Targets["SERVICE"])
		}
		applyServiceChange(svc, p.ServiceDiff)
	case "REGISTER_INSTANCE":
		svc := s.st.Services[p.ServiceId]
		if svc == nil {
			return errorf("ServiceNotFound", "Service %s not found", p.ServiceId)
		}
		if _, exists := svc.Instances[p.Instance.Id]; !exists {
			if err := s.checkInstanceQuota(svc); err != nil {
				return err
			}
			s.ix.nsInstances[svc.NamespaceId]++
		}
		s.record(svc, p.Instance.Id)
		svc.Instances[p.Instance.Id] = p.Instance
		svc.Revision++
	case "DEREGISTER_INSTANCE":
		svc := s.st.Services[op.Targets["SERVICE"]]
		id := op.Targets["INSTANCE"]
		if svc == nil || svc.Instances[id] == nil {
			return errorf("InstanceNotFound", "Instance %s not found", id)
		}
		s.record(svc, id)
		delete(svc.Instances, id)
		s.ix.nsInstances[svc.NamespaceId]--
		svc.Revision++
	}
	return nil
}

// pendingOn finds an unfinished operation whose targets include all the
// given ones: the service answers a second change meanwhile with
// DuplicateRequest. Callers hold s.mu.
func (s *region) pendingOn(targets map[string]string) *operationRec {
next:
	for _, op := range s.pending {
		for k, v := range targets {
			if op.Targets[k] != v {
				continue next
			}
		}
		return op
	}
	return nil
}

func duplicateRequest(op *operationRec) *apiError {
	e := errorf("DuplicateRequest", "Operation %s on the same resource is still in progress", op.Id)
	e.Extra = map[string]any{"DuplicateOperationId": op.Id}
	return e
}

// status reports SUBMITTED for the first half of the operation's time,
// then PENDING.
func (s *region) status(op *operationRec) string {
	if op.Pending == nil {
		return op.Status
	}
	if time.Since(op.CreateDate) < op.DueAt.Sub(op.CreateDate)/2 {
		return "SUBMITTED"
	}
	return "PENDING"
}

// GetOperation answers only the caller's own operations (the docs are
// silent on other accounts' ids: strict reading); one on a namespace
// another account owns needs that OwnerAccount, and access to the namespace.
func (s *region) GetOperation(ctx context.Context, in *GetOperationRequest) (*GetOperationResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	who := callerFrom(ctx).account
	op := s.st.Operations[in.OperationId]
	if op == nil || op.Account != who || !s.reachable(op, who, in.OwnerAccount) {
		return nil, errorf("OperationNotFound", "Operation %s not found", in.OperationId)
	}
	out := &Operation{
		Id: op.Id, OwnerAccount: op.Owner, Type: op.Type, Status: s.status(op), ErrorCode: op.ErrorCode, ErrorMessage: op.ErrorMessage,
		CreateDate: ts(op.CreateDate), UpdateDate: ts(op.UpdateDate), Targets: op.Targets,
	}
	return &GetOperationResponse{Operation: out}, nil
}

// reachable reports whether who may read op given the OwnerAccount it
// named: its own namespace's without one, a shared one's with its owner.
func (s *region) reachable(op *operationRec, who, ownerAccount string) bool {
	if op.Owner == who {
		return ownerAccount == "" || ownerAccount == who
	}
	ns := s.st.Namespaces[op.Targets["NAMESPACE"]]
	return ownerAccount == op.Owner && (ns == nil || s.visibleTo(ns, who))
}

// ListOperations lists the caller's operations on its own namespaces,
// newest first. Operations on a shared namespace by other accounts are
// never listed (the Developer Guide); nor are a consumer's own operations
// on a namespace shared with it (not documented: strict reading). As the
// model documents, a page is MaxResults of all those operations, filtered
// after: it may hold none that match and still carry a NextToken.
func (s *region) ListOperations(ctx context.Context, in *ListOperationsRequest) (*ListOperationsResponse, error) {
	who := callerFrom(ctx).account
	match, err := operationFilter(in.Filters)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addTenantOperations(who, time.Now())
	// Newest first, as the console shows them; the key pages stably.
	list := s.ix.ops[who]
	nth := func(i int) *opEntry { return &list[len(list)-1-i] } // the i-th listed
	start, end, next, err := pageOf(len(list), func(i int) string { return nth(i).key }, in.NextToken, in.MaxResults, 100)
	if err != nil {
		return nil, err
	}
	out := &ListOperationsResponse{NextToken: next, Operations: []OperationSummary{}}
	for i := start; i < end; i++ {
		op := nth(i).op
		if st := s.status(op); match(op, st) {
			out.Operations = append(out.Operations, OperationSummary{Id: op.Id, Status: st})
		}
	}
	return out, nil
}

// tenantNamespace and tenantService are where the account's other tenants
// (Profile.TenantOperations) register: a DNS namespace's service this
// emulator does not hold, as an ECS service's would be to clustermap.
const (
	tenantNamespace = "ns-tenantecsservice"
	tenantService   = "srv-tenantecsservice"
)

// addTenantOperations adds the finished operations the account's other
// tenants made since the last call, at their rate: task registrations and
// deregistrations of an ECS service. The first call starts the clock.
// Callers hold s.mu for writing.
func (s *region) addTenantOperations(account string, now time.Time) {
	rate := s.profile.TenantOperations
	if rate <= 0 {
		return
	}
	last, ok := s.tenants[account]
	if !ok {
		s.tenants[account] = now
		return
	}
	every := time.Duration(float64(time.Second) / rate)
	// A long pause adds no more than MaxOperations keep.
	if n := now.Sub(last) / every; n > time.Duration(s.opts.MaxOperations) {
		last = now.Add(-time.Duration(s.opts.MaxOperations) * every)
	}
	for t := last.Add(every); !t.After(now); t = t.Add(every) {
		typ := "REGISTER_INSTANCE"
		if rand.IntN(2) == 0 {
			typ = "DEREGISTER_INSTANCE"
		}
		op := &operationRec{
			Id: newOperationID(), Type: typ, Status: "SUCCESS", Account: account, Owner: account,
			CreateDate: t.Add(-s.profile.OperationTime.draw()), UpdateDate: t,
			Targets: map[string]string{"NAMESPACE": tenantNamespace, "SERVICE": tenantService, "INSTANCE": "task-" + randomID(12)},
		}
		s.st.Operations[op.Id] = op
		s.ix.addOperation(op)
		s.finished = append(s.finished, op.Id)
		last = t
	}
	s.tenants[account] = last
	s.prune()
	s.changed()
}
