//go:build e2e

package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/registry"
	cmschema "github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/replication"
)

// counts are what the campaign must bring to zero.
type counts struct {
	lostWhileLive    []string // imports or replicas that vanished while their source lived
	leftAfterEnd     []string // imports, replicas, Cloud Map services or claims of withdrawn items
	strayRecords     []string // registry records (Cloud Map instances, hub ClusterExports) with no live endpoint behind them
	missingEndpoints []string // live endpoints absent from the registry
	mismatched       []string // imports or replicas missing, or serving other addresses than their source
	unreadable       error
}

func (c counts) err() error {
	if c.unreadable != nil {
		return c.unreadable
	}
	var errs []error
	for _, l := range []struct {
		what string
		list []string
	}{{"lost while live", c.lostWhileLive}, {"left after their end", c.leftAfterEnd}, {"registry records with no live endpoint", c.strayRecords},
		{"endpoints missing from the registry", c.missingEndpoints}, {"imports or replicas not matching their source", c.mismatched}} {
		if len(l.list) > 0 {
			sort.Strings(l.list)
			errs = append(errs, fmt.Errorf("%d %s, such as %s", len(l.list), l.what, strings.Join(l.list[:min(3, len(l.list))], "; ")))
		}
	}
	return errors.Join(errs...)
}

// clusterView is what one cluster holds in the soak namespaces. Endpoints
// are what an EndpointSlice says of each (endpointKey): its address and
// each of its ports, by name, number and protocol.
type clusterView struct {
	own      map[string]map[string][]string // namespace/name -> address type -> endpoints (all), from the cluster's own slices
	ready    map[string][]string            // namespace/name -> ready endpoints, own slices
	imports  map[string]bool                // namespace/name of ServiceImports
	imported map[string][]string            // namespace/name@source -> ready endpoints imported
	replicas map[string]string              // namespace/name -> source cluster of a replica
	served   map[string][]string            // namespace/name -> ready endpoints of a replica's slices
	family   map[string]string              // namespace/name -> first IP family of the Service
}

func (f *fleet) view(ctx context.Context, cl client.Client) (*clusterView, error) {
	v := &clusterView{own: map[string]map[string][]string{}, ready: map[string][]string{}, imports: map[string]bool{},
		imported: map[string][]string{}, replicas: map[string]string{}, served: map[string][]string{}, family: map[string]string{}}
	for _, ns := range []string{nsMCS, nsSyn, nsDNS} {
		eps := &discoveryv1.EndpointSliceList{}
		if err := cl.List(ctx, eps, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		for _, s := range eps.Items {
			var ready []string
			var all []string
			for _, e := range s.Endpoints {
				for _, a := range e.Addresses {
					for _, p := range s.Ports {
						k := endpointKey(a, ptr.Deref(p.Name, ""), ptr.Deref(p.Port, 0), string(ptr.Deref(p.Protocol, corev1.ProtocolTCP)))
						all = append(all, k)
						if e.Conditions.Ready == nil || *e.Conditions.Ready {
							ready = append(ready, k)
						}
					}
				}
			}
			switch s.Labels[discoveryv1.LabelManagedBy] {
			case "endpointslice-controller.k8s.io":
				key := ns + "/" + s.Labels[discoveryv1.LabelServiceName]
				if v.own[key] == nil {
					v.own[key] = map[string][]string{}
				}
				v.own[key][string(s.AddressType)] = append(v.own[key][string(s.AddressType)], all...)
				v.ready[key] = append(v.ready[key], ready...)
			case replication.ManagedBy:
				key := ns + "/" + s.Labels[discoveryv1.LabelServiceName]
				v.served[key] = append(v.served[key], ready...)
			default:
				if src := s.Labels[mcsv1beta1.LabelSourceCluster]; src != "" {
					key := ns + "/" + s.Labels[mcsv1beta1.LabelServiceName] + "@" + src
					v.imported[key] = append(v.imported[key], ready...)
				}
			}
		}
		svcs := &corev1.ServiceList{}
		if err := cl.List(ctx, svcs, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		for _, s := range svcs.Items {
			key := ns + "/" + s.Name
			if src := s.Labels[replication.LabelSourceCluster]; src != "" {
				v.replicas[key] = src
			}
			if len(s.Spec.IPFamilies) > 0 {
				v.family[key] = string(s.Spec.IPFamilies[0])
			}
		}
	}
	imps := &mcsv1beta1.ServiceImportList{}
	if err := cl.List(ctx, imps, client.InNamespace(nsMCS)); err != nil {
		return nil, err
	}
	for _, si := range imps.Items {
		v.imports[si.Namespace+"/"+si.Name] = true
	}
	return v, nil
}

// instance is one Cloud Map instance, by service.
type instance struct {
	id      string
	service string
	attrs   map[string]string
}

func (i instance) ip() string {
	if ip := i.attrs["AWS_INSTANCE_IPV4"]; ip != "" {
		return ip
	}
	return i.attrs["AWS_INSTANCE_IPV6"]
}

// cloudMap reads every instance of the namespaces of the campaign: the
// MCS namespace (named after the Kubernetes one) and the DNS namespace.
func (f *fleet) cloudMap(ctx context.Context) (map[string][]instance, error) {
	out := map[string][]instance{}
	nss, err := f.sd.ListNamespaces(ctx, &sd.ListNamespacesInput{})
	if err != nil {
		return nil, err
	}
	for _, ns := range nss.Namespaces {
		name := aws.ToString(ns.Name)
		if name != nsMCS && name != dnsNamespace {
			continue
		}
		p := sd.NewListServicesPaginator(f.sd, &sd.ListServicesInput{Filters: []sdtypes.ServiceFilter{{Name: sdtypes.ServiceFilterNameNamespaceId, Values: []string{aws.ToString(ns.Id)}}}})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				return nil, err
			}
			for _, s := range page.Services {
				key := name + "/" + aws.ToString(s.Name)
				out[key] = nil // a service, maybe empty
				ip := sd.NewListInstancesPaginator(f.sd, &sd.ListInstancesInput{ServiceId: s.Id})
				for ip.HasMorePages() {
					ipage, err := ip.NextPage(ctx)
					if err != nil {
						return nil, err
					}
					for _, in := range ipage.Instances {
						out[key] = append(out[key], instance{id: aws.ToString(in.Id), service: aws.ToString(s.Name), attrs: in.Attributes})
					}
				}
			}
		}
	}
	return out, nil
}

// check compares every cluster and the registry with the workload's truth.
func (f *fleet) check(ctx context.Context) counts {
	var c counts
	views := make([]*clusterView, len(f.clients))
	for i, cl := range f.clients {
		v, err := f.view(ctx, cl)
		if err != nil {
			c.unreadable = fmt.Errorf("reading cluster %d: %w", i, err)
			return c
		}
		views[i] = v
	}
	live := map[item]bool{}
	for _, it := range f.w.snapshot() {
		live[it] = true
	}
	byName := map[string]item{}
	for it := range live {
		byName[it.name] = it
	}
	for _, it := range f.w.endedItems() {
		if _, ok := byName[it.name]; !ok {
			byName[it.name] = it
		}
	}

	// Imports and replicas: complete for live items, gone for ended ones.
	for it := range live {
		key := it.kind.namespace() + "/" + it.name
		want := sorted(views[it.cluster].ready[key])
		for j, v := range views {
			if j == it.cluster {
				continue
			}
			switch it.kind {
			case kindMCS:
				if !v.imports[key] {
					c.mismatched = append(c.mismatched, fmt.Sprintf("%s not imported in cluster %d", it, j))
				} else if got := sorted(v.imported[key+"@"+f.ids[it.cluster]]); !slices.Equal(got, want) {
					c.mismatched = append(c.mismatched, fmt.Sprintf("%s in cluster %d serves %v, want %v", it, j, got, want))
				}
			case kindSyn:
				if v.replicas[key] != f.ids[it.cluster] {
					c.mismatched = append(c.mismatched, fmt.Sprintf("%s not replicated to cluster %d", it, j))
				} else if got := sorted(v.served[key]); !slices.Equal(got, want) {
					c.mismatched = append(c.mismatched, fmt.Sprintf("%s in cluster %d serves %v, want %v", it, j, got, want))
				}
			}
		}
	}
	// No import from a cluster that does not export it, nor of an address
	// the hostile writer forged.
	for j, v := range views {
		for key, ips := range v.imported {
			name, src, _ := strings.Cut(strings.TrimPrefix(key, nsMCS+"/"), "@")
			if it, ok := byName[name]; ok && it.kind == kindMCS && f.ids[it.cluster] != src {
				c.mismatched = append(c.mismatched, fmt.Sprintf("%s imported in cluster %d from %s, which does not export it", it, j, src))
			}
			for _, ep := range ips {
				if forgedAddress(addressOf(ep)) {
					c.mismatched = append(c.mismatched, fmt.Sprintf("%s in cluster %d serves the forged address %s", key, j, ep))
				}
			}
		}
	}
	for _, it := range f.w.endedItems() {
		key := it.kind.namespace() + "/" + it.name
		for j, v := range views {
			if j != it.cluster && (it.kind == kindMCS && v.imports[key] || it.kind == kindSyn && v.replicas[key] != "") {
				c.leftAfterEnd = append(c.leftAfterEnd, fmt.Sprintf("%s still in cluster %d", it, j))
			}
		}
	}
	if len(c.mismatched) > 0 || len(c.leftAfterEnd) > 0 {
		return c // the registry is read (a few hundred calls) once the clusters agree
	}
	read := f.cloudMapRecords
	if f.hub != nil {
		read = f.hubRecords
	}
	registered, err := read(ctx, &c, views, live, byName)
	if err != nil {
		c.unreadable = err
		return c
	}
	for it := range live {
		if it.kind == kindSyn {
			continue
		}
		key := it.kind.namespace() + "/" + it.name
		for _, ep := range views[it.cluster].ready[key] {
			if it.kind == kindDNS && !inFamily(addressOf(ep), views[it.cluster].family[key]) {
				continue // registered in the Service's first family only
			}
			if !registered[string(it.kind)+"/"+it.name+"/"+ep] {
				c.missingEndpoints = append(c.missingEndpoints, fmt.Sprintf("%s endpoint %s", it, ep))
			}
		}
	}
	return c
}

// cloudMapRecords compares Cloud Map's instances with the endpoints: each
// one not backed by a live endpoint is stray, and what is left of ended
// items is left. It returns the endpoints registered, by kind/name/key.
func (f *fleet) cloudMapRecords(ctx context.Context, c *counts, views []*clusterView, live map[item]bool, byName map[string]item) (map[string]bool, error) {
	cm, err := f.cloudMap(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading Cloud Map: %w", err)
	}
	for _, it := range f.w.endedItems() {
		if it.kind != kindDNS {
			continue
		}
		for _, name := range []string{it.name, cloudmapdns.LockName(it.name)} {
			if _, ok := cm[dnsNamespace+"/"+name]; ok {
				c.leftAfterEnd = append(c.leftAfterEnd, fmt.Sprintf("Cloud Map service %s of %s", name, it))
			}
		}
	}

	// Cloud Map against the endpoints: every instance backed by a live
	// endpoint, every ready endpoint registered.
	registered := map[string]bool{} // kind/name/ip
	for key, ins := range cm {
		ns, name, _ := strings.Cut(key, "/")
		if ns == nsMCS {
			// MCS records, per endpoint or packed: read as an importer does.
			var records []cmschema.Instance
			for _, in := range ins {
				if !strings.HasPrefix(in.id, forgedPrefix) && in.attrs[cmschema.AttrClusterID] != forgedCluster {
					records = append(records, cmschema.Instance{ID: in.id, Attrs: in.attrs})
				}
			}
			for _, e := range cmschema.Decode(registry.Key{Namespace: ns, Name: name}, records) {
				it, ok := byName[name]
				desc := fmt.Sprintf("%s of cluster %s", key, e.Cluster)
				if !ok || !live[it] || f.ids[it.cluster] != e.Cluster {
					c.strayRecords = append(c.strayRecords, desc+" (no live source)")
					continue
				}
				for _, inv := range e.Invalid {
					c.strayRecords = append(c.strayRecords, fmt.Sprintf("%s record %s: %s", desc, inv.ID, inv.Reason))
				}
				var keys []string
				for _, ep := range e.Endpoints {
					keys = append(keys, endpointKey(ep.IP, ep.PortName, ep.Port, string(ep.Protocol)))
				}
				backed(c, registered, desc, it, views[it.cluster], keys)
			}
			continue
		}
		for _, in := range ins {
			var it item
			var ok bool
			var cluster string
			switch ns {
			case nsMCS:
				cluster = in.attrs[cmschema.AttrClusterID]
				it, ok = byName[in.service]
			default:
				cluster = in.attrs[cloudmapdns.AttrCluster]
				it, ok = byName[in.attrs[cloudmapdns.AttrService]]
			}
			desc := fmt.Sprintf("%s %v", key, in.attrs)
			if !ok || !live[it] || f.ids[it.cluster] != cluster {
				c.strayRecords = append(c.strayRecords, desc+" (no live source)")
				continue
			}
			if in.attrs[cmschema.AttrRecord] != "" {
				continue // MCS's service record: its source is live
			}
			// A DNS record: its address and port (A/AAAA and SRV) are an
			// endpoint's.
			own := views[it.cluster].own[it.kind.namespace()+"/"+it.name]
			k := ""
			for _, eps := range own {
				for _, ep := range eps {
					if addressOf(ep) == in.ip() && portOf(ep) == in.attrs["AWS_INSTANCE_PORT"] {
						k = ep
					}
				}
			}
			if k == "" {
				c.strayRecords = append(c.strayRecords, desc+" (no such endpoint)")
				continue
			}
			registered[string(it.kind)+"/"+it.name+"/"+k] = true
		}
	}
	return registered, nil
}

// hubRecords compares the hub's ClusterExports with the endpoints, as
// cloudMapRecords does Cloud Map's instances.
func (f *fleet) hubRecords(ctx context.Context, c *counts, views []*clusterView, live map[item]bool, byName map[string]item) (map[string]bool, error) {
	list := &hubv1alpha1.ClusterExportList{}
	if err := f.hub.admin.List(ctx, list, client.InNamespace(hub.Namespace(f.env.ClusterSet))); err != nil {
		return nil, fmt.Errorf("reading the hub: %w", err)
	}
	registered := map[string]bool{}
	for _, o := range list.Items {
		name := o.Spec.Service.Name
		desc := fmt.Sprintf("ClusterExport %s (%s/%s of cluster %s)", o.Name, o.Spec.Service.Namespace, name, o.Spec.Cluster)
		it, ok := byName[name]
		if o.Spec.Service.Namespace != nsMCS || !ok || !live[it] || f.ids[it.cluster] != o.Spec.Cluster {
			c.strayRecords = append(c.strayRecords, desc+" (no live source)")
			continue
		}
		var keys []string
		for _, ep := range o.Spec.Endpoints {
			keys = append(keys, endpointKey(ep.IP, ep.PortName, ep.Port, string(ep.Protocol)))
		}
		backed(c, registered, desc, it, views[it.cluster], keys)
	}
	return registered, nil
}

// backed holds the endpoints (endpointKey) a record of a live item says
// to its source's: each the source has is registered (by kind/name/key),
// each it has not is a stray.
func backed(c *counts, registered map[string]bool, desc string, it item, source *clusterView, keys []string) {
	var all []string
	for _, eps := range source.own[it.kind.namespace()+"/"+it.name] {
		all = append(all, eps...)
	}
	for _, k := range keys {
		if !slices.Contains(all, k) {
			c.strayRecords = append(c.strayRecords, fmt.Sprintf("%s endpoint %s (no such endpoint)", desc, k))
			continue
		}
		registered[string(it.kind)+"/"+it.name+"/"+k] = true
	}
}

// endpointKey is an endpoint's address with one of its ports, as an
// EndpointSlice or a Cloud Map record says them.
func endpointKey(addr, portName string, port int32, protocol string) string {
	return fmt.Sprintf("%s %s/%d/%s", addr, portName, port, protocol)
}

func addressOf(key string) string {
	addr, _, _ := strings.Cut(key, " ")
	return addr
}

// portOf is the port number of an endpointKey.
func portOf(key string) string {
	_, rest, _ := strings.Cut(key, " ")
	parts := strings.Split(rest, "/")
	return parts[len(parts)-2]
}

func inFamily(ip, family string) bool {
	return (family == string(corev1.IPv6Protocol)) == strings.Contains(ip, ":")
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return slices.Compact(out)
}
