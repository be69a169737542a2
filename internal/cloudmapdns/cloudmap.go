package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmapclient/diff"
)

// Tags on the Cloud Map services this mode creates, beside clustermap's
// mark (cloudmapclient.Marked): TagCreatedBy names the registration (or
// lock holder) that created one, and is what deletion is conditioned on,
// here and in the IAM policy: versions before the mark set only it.
// TagClaimedBy names the holder of a claim lock.
const (
	TagClaimedBy = "clustermap.io/claimed-by"
	TagCreatedBy = "clustermap.io/created-by"
)

// ErrNamespaceNotFound says the annotated Cloud Map namespace is missing.
var ErrNamespaceNotFound = errors.New("Cloud Map namespace not found")

// CloudMap is the thin adapter over the Cloud Map API.
type CloudMap struct{ c *sd.Client }

// NewCloudMap adapts a client.
func NewCloudMap(c *sd.Client) CloudMap { return CloudMap{c} }

// Namespace is a Cloud Map namespace found by name.
type Namespace struct {
	ID   string
	Type types.NamespaceType
}

// Service is a Cloud Map service found by name.
type Service struct {
	ID, ARN string
}

// FindNamespace looks a namespace up by name.
func (m CloudMap) FindNamespace(ctx context.Context, name string) (Namespace, error) {
	ns, err := cloudmapclient.FindNamespace(ctx, m.c, name, "")
	if err != nil {
		return Namespace{}, err
	}
	if ns == nil {
		return Namespace{}, fmt.Errorf("%w: %s", ErrNamespaceNotFound, name)
	}
	return Namespace{ID: aws.ToString(ns.Id), Type: ns.Type}, nil
}

// DNSSettings shape a service clustermap creates.
type DNSSettings struct {
	TTL    int64
	Family string // "A" or "AAAA"
	SRV    bool
}

// EnsureService finds or creates the service name in ns and returns its
// id; a created one is tagged as created by owner.
func (m CloudMap) EnsureService(ctx context.Context, ns Namespace, name, owner string, dns DNSSettings) (string, error) {
	in := &sd.CreateServiceInput{
		Name: aws.String(name), NamespaceId: aws.String(ns.ID),
		Description: aws.String("created by clustermap for " + owner),
		Tags:        cloudmapclient.Marked(types.Tag{Key: aws.String(TagCreatedBy), Value: aws.String(owner)}),
	}
	if ns.Type != types.NamespaceTypeHttp {
		recs := []types.DnsRecord{{Type: types.RecordType(dns.Family), TTL: aws.Int64(dns.TTL)}}
		if dns.SRV {
			recs = append(recs, types.DnsRecord{Type: types.RecordTypeSrv, TTL: aws.Int64(dns.TTL)})
		}
		in.DnsConfig = &types.DnsConfig{RoutingPolicy: types.RoutingPolicyMultivalue, DnsRecords: recs}
	}
	out, err := m.c.CreateService(ctx, in)
	var exists *types.ServiceAlreadyExists
	switch {
	case err == nil:
		return aws.ToString(out.Service.Id), nil
	case errors.As(err, &exists):
		return aws.ToString(exists.ServiceId), nil
	}
	return "", fmt.Errorf("creating Cloud Map service %s: %w", name, err)
}

const lockDescription = "clustermap claim, held by "

// CreateLock creates a claim lock: a service with no DNS records (type
// HTTP), so it never shows in DNS, tagged with its holder.
func (m CloudMap) CreateLock(ctx context.Context, namespaceID, name, holder string) (string, error) {
	out, err := m.c.CreateService(ctx, &sd.CreateServiceInput{
		Name: aws.String(name), NamespaceId: aws.String(namespaceID), Type: types.ServiceTypeOptionHttp,
		Description: aws.String(lockDescription + holder),
		Tags:        cloudmapclient.Marked(types.Tag{Key: aws.String(TagClaimedBy), Value: aws.String(holder)}, types.Tag{Key: aws.String(TagCreatedBy), Value: aws.String(holder)}),
	})
	var exists *types.ServiceAlreadyExists
	switch {
	case err == nil:
		return aws.ToString(out.Service.Id), nil
	case errors.As(err, &exists):
		return "", &LockTaken{ID: aws.ToString(exists.ServiceId)}
	}
	return "", fmt.Errorf("creating claim lock %s: %w", name, err)
}

// LockHolder reads the holder of a lock from its description, written
// with the holder tag at creation: one call, and drift checks make it for
// every registered Service.
func (m CloudMap) LockHolder(ctx context.Context, id string) (string, error) {
	got, err := m.c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(id)})
	if IsServiceGone(err) {
		return "", ErrLockGone
	}
	if err != nil {
		return "", err
	}
	holder, ok := strings.CutPrefix(aws.ToString(got.Service.Description), lockDescription)
	if !ok {
		return "", fmt.Errorf("claim lock %s has description %q, not one clustermap writes", id, aws.ToString(got.Service.Description))
	}
	return holder, nil
}

// DeleteLock deletes a lock by its id.
func (m CloudMap) DeleteLock(ctx context.Context, id string) error {
	_, err := m.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(id)})
	if IsServiceGone(err) {
		return nil
	}
	return err
}

// FindServices looks services up by name, without creating them.
func (m CloudMap) FindServices(ctx context.Context, ns Namespace, names ...string) (map[string]Service, error) {
	found := map[string]Service{}
	p := sd.NewListServicesPaginator(m.c, &sd.ListServicesInput{Filters: []types.ServiceFilter{
		{Name: types.ServiceFilterNameNamespaceId, Values: []string{ns.ID}, Condition: types.FilterConditionEq},
	}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range page.Services {
			if name := aws.ToString(s.Name); slices.Contains(names, name) {
				found[name] = Service{ID: aws.ToString(s.Id), ARN: aws.ToString(s.Arn)}
			}
		}
	}
	return found, nil
}

// Instances lists every instance of a service, ours and others'.
func (m CloudMap) Instances(ctx context.Context, serviceID string) (map[string]Attrs, error) {
	out := map[string]Attrs{}
	p := sd.NewListInstancesPaginator(m.c, &sd.ListInstancesInput{ServiceId: aws.String(serviceID)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, in := range page.Instances {
			out[aws.ToString(in.Id)] = in.Attributes
		}
	}
	return out, nil
}

// Applied is what an Apply did: the instances written, and the
// operations of the writes it did not wait for.
type Applied struct {
	Registered, Deregistered []string
	Running                  []string // operation ids
}

// Apply registers, then deregisters (so that a name never goes empty
// while it changes), a few calls at a time, waiting for the operations when
// wait is set. It returns what succeeded.
func (m CloudMap) Apply(ctx context.Context, serviceID string, p diff.Changes, wait bool) (Applied, error) {
	regs := make([]cloudmapclient.Write, 0, len(p.Register))
	for id, attrs := range p.Register {
		regs = append(regs, cloudmapclient.Write{ID: id, Attributes: attrs})
	}
	deregs := make([]cloudmapclient.Write, len(p.Deregister))
	for i, id := range p.Deregister {
		deregs[i] = cloudmapclient.Write{ID: id}
	}
	var a Applied
	var ops1, ops2 []string
	var err1, err2 error
	a.Registered, ops1, err1 = m.write(ctx, serviceID, regs, wait)
	a.Deregistered, ops2, err2 = m.write(ctx, serviceID, deregs, wait)
	a.Running = append(ops1, ops2...)
	return a, errors.Join(err1, err2)
}

// write sends writes, waiting for each operation when wait is set, and
// returns the ids written (a deregistration of an instance already gone
// too) and the operations not waited for.
func (m CloudMap) write(ctx context.Context, serviceID string, writes []cloudmapclient.Write, wait bool) ([]string, []string, error) {
	worked := make([]bool, len(writes))
	ops := make([]string, len(writes))
	err := cloudmapclient.WriteInstances(ctx, m.c, serviceID, writes, func(i int, o cloudmapclient.Outcome) error {
		if o.Missing {
			worked[i] = true
			return nil
		}
		err := o.Err
		if err == nil && wait {
			_, err = cloudmapclient.WaitOperation(ctx, m.c, aws.String(o.Op))
		}
		if err != nil {
			return fmt.Errorf("instance %s: %w", writes[i].ID, err)
		}
		worked[i] = true
		if !wait {
			ops[i] = o.Op
		}
		return nil
	})
	var ok, running []string
	for i, w := range writes {
		if worked[i] {
			ok = append(ok, w.ID)
		}
		if ops[i] != "" {
			running = append(running, ops[i])
		}
	}
	return ok, running, err
}

// Ended looks up operations: those still running or unanswered (a
// throttled lookup), and the failures of those that ended FAIL (Cloud Map
// accepted the write, then did not make it).
func (m CloudMap) Ended(ctx context.Context, ops []string) (running []string, failed error) {
	status := make([]*types.Operation, len(ops))
	_ = cloudmapclient.Each(ctx, len(ops), func(ctx context.Context, i int) error {
		out, err := m.c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(ops[i])})
		if err == nil {
			status[i] = out.Operation
		}
		return err
	})
	var fails []error
	for i, op := range status {
		switch {
		case op == nil: // unread: asked again next time
			running = append(running, ops[i])
		case op.Status == types.OperationStatusFail:
			fails = append(fails, fmt.Errorf("%s of instance %s: %s %s", op.Type, op.Targets[string(types.OperationTargetTypeInstance)],
				aws.ToString(op.ErrorCode), aws.ToString(op.ErrorMessage)))
		case op.Status != types.OperationStatusSuccess:
			running = append(running, ops[i])
		}
	}
	return running, errors.Join(fails...)
}

// DeleteIfCreated deletes a service clustermap created, unless others
// registered in it meanwhile. Only the claim's holder calls it, after
// taking its instances out.
func (m CloudMap) DeleteIfCreated(ctx context.Context, svc Service) error {
	tags, err := cloudmapclient.Tags(ctx, m.c, aws.String(svc.ARN))
	if IsServiceGone(err) {
		return nil
	}
	if err != nil || tags[TagCreatedBy] == "" {
		return err
	}
	_, err = m.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(svc.ID)})
	var inUse *types.ResourceInUse
	if err == nil || IsServiceGone(err) || errors.As(err, &inUse) {
		return nil
	}
	return err
}

// IsServiceGone reports a service deleted behind our back.
func IsServiceGone(err error) bool {
	var gone *types.ServiceNotFound
	var res *types.ResourceNotFoundException
	return errors.As(err, &gone) || errors.As(err, &res)
}
