package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/kube"
)

// A peer's kubeconfig is another cluster's controller acting here: it
// gets what replication does in a peer (peers.go, reconciler.go) and
// nothing else, in the namespaces replicated only when they are named,
// through a ServiceAccount of its own per consuming cluster (so one can be
// revoked alone) and a token that expires.

// PeerAccess is one consuming cluster's access to this cluster.
type PeerAccess struct {
	// For is the cluster that uses the kubeconfig (its --cluster-name).
	For string
	// Namespace holds the ServiceAccount.
	Namespace string
	// Namespaces limits access to these namespaces (RoleBindings); none is
	// every namespace (a ClusterRoleBinding), as a controller without
	// --namespaces needs.
	Namespaces []string
	// CreateNamespaces adds the right to create namespaces, as a
	// controller with --create-namespaces needs.
	CreateNamespaces bool
}

// PeerRole is the ClusterRole a consuming cluster is bound to; with
// namespace creation it is PeerRole + "-create-namespaces".
const PeerRole = "clustermap-peer"

// LabelPeerFor marks what was made for a consuming cluster.
const LabelPeerFor = "syndicate.clustermap.io/peer-for"

// peerRules is what a peer's replication reads and writes.
func peerRules() []rbacv1.PolicyRule {
	rw := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: rw},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: rw},
		// The orphan the endpoints mirroring controller leaves behind.
		{APIGroups: []string{""}, Resources: []string{"endpoints"}, Verbs: []string{"delete"}},
		// A namespace is checked before a replica is made in it (a
		// RoleBinding in it grants its own get).
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
	}
}

// ServiceAccountName is the ServiceAccount of a consuming cluster.
func (a PeerAccess) ServiceAccountName() string { return PeerRole + "-" + a.For }

// Objects are the RBAC and admission objects, ServiceAccount first, that
// grant a.
func (a PeerAccess) Objects() []client.Object {
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "clustermap", LabelPeerFor: a.For}}
	}
	// The ClusterRoles are shared by every consumer.
	shared := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "clustermap"}}
	}
	sa := a.ServiceAccountName()
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: a.Namespace, Name: sa}}
	role := func(name string) rbacv1.RoleRef {
		return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
	}
	out := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: meta(a.Namespace, sa)},
		&rbacv1.ClusterRole{ObjectMeta: shared(PeerRole), Rules: peerRules()},
		peerPolicy(shared(PeerRole)),
		peerPolicyBinding(shared(PeerRole)),
	}
	if len(a.Namespaces) == 0 {
		out = append(out, &rbacv1.ClusterRoleBinding{ObjectMeta: meta("", sa), RoleRef: role(PeerRole), Subjects: subjects})
	}
	for _, ns := range a.Namespaces {
		out = append(out, &rbacv1.RoleBinding{ObjectMeta: meta(ns, sa), RoleRef: role(PeerRole), Subjects: subjects})
	}
	if a.CreateNamespaces {
		create := PeerRole + "-create-namespaces"
		out = append(out,
			&rbacv1.ClusterRole{ObjectMeta: shared(create), Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create"}}}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: meta("", create+"-"+a.For), RoleRef: role(create), Subjects: subjects})
	}
	return out
}

// MinPeerTokenLifetime is the shortest token the API server issues.
const MinPeerTokenLifetime = 10 * time.Minute

// GrantPeer makes (or updates) a's ServiceAccount and bindings in the
// cluster c reaches, removing bindings a no longer names, and returns a
// token for it valid for ttl (or less, where the API server caps token
// lifetimes) and when it expires.
func GrantPeer(ctx context.Context, c client.Client, cs kubernetes.Interface, a PeerAccess, ttl time.Duration) (string, time.Time, error) {
	if ttl < MinPeerTokenLifetime {
		return "", time.Time{}, fmt.Errorf("a token lifetime of %v is below the API server's minimum of %v", ttl, MinPeerTokenLifetime)
	}
	for _, ns := range a.Namespaces {
		if err := c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}); err != nil {
			return "", time.Time{}, fmt.Errorf("namespace %s, to be replicated into: %w (create it first)", ns, err)
		}
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: a.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", time.Time{}, err
	}
	want := a.Objects()
	for _, o := range want {
		if err := kube.Upsert(ctx, c, o); err != nil {
			return "", time.Time{}, fmt.Errorf("%T %s: %w", o, client.ObjectKeyFromObject(o), err)
		}
	}
	if err := dropStale(ctx, c, a.For, want); err != nil {
		return "", time.Time{}, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(a.Namespace).CreateToken(ctx, a.ServiceAccountName(), &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl / time.Second))}}, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("token for ServiceAccount %s/%s: %w", a.Namespace, a.ServiceAccountName(), err)
	}
	return tr.Status.Token, tr.Status.ExpirationTimestamp.Time, nil
}

// RevokePeer deletes what GrantPeer made for a consuming cluster: its
// ServiceAccount goes, and with it every token issued for it.
func RevokePeer(ctx context.Context, c client.Client, a PeerAccess) error {
	return dropStale(ctx, c, a.For, nil)
}

// dropStale deletes the bindings and ServiceAccount made for a consuming
// cluster that keep are not (all of them when keep is empty). The shared
// ClusterRoles stay: other consumers are bound to them.
func dropStale(ctx context.Context, c client.Client, forCluster string, keep []client.Object) error {
	kept := func(o client.Object) bool {
		return slices.ContainsFunc(keep, func(k client.Object) bool {
			return fmt.Sprintf("%T", k) == fmt.Sprintf("%T", o) && client.ObjectKeyFromObject(k) == client.ObjectKeyFromObject(o)
		})
	}
	sel := client.MatchingLabels{LabelPeerFor: forCluster}
	var found []client.Object
	rbs, crbs, sas := &rbacv1.RoleBindingList{}, &rbacv1.ClusterRoleBindingList{}, &corev1.ServiceAccountList{}
	for _, l := range []client.ObjectList{rbs, crbs, sas} {
		if err := c.List(ctx, l, sel); err != nil {
			return err
		}
	}
	for i := range rbs.Items {
		found = append(found, &rbs.Items[i])
	}
	for i := range crbs.Items {
		found = append(found, &crbs.Items[i])
	}
	for i := range sas.Items {
		found = append(found, &sas.Items[i])
	}
	var errs []error
	for _, o := range found {
		if !kept(o) {
			errs = append(errs, client.IgnoreNotFound(c.Delete(ctx, o)))
		}
	}
	return errors.Join(errs...)
}

// IssuePeerKubeconfig grants a in the cluster cfg reaches (as an admin)
// and returns a kubeconfig for it, naming that cluster name and reaching
// it at server (cfg's when empty), and when its token expires.
func IssuePeerKubeconfig(ctx context.Context, cfg *rest.Config, name, server string, a PeerAccess, ttl time.Duration) ([]byte, time.Time, error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, time.Time{}, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, time.Time{}, err
	}
	token, expiry, err := GrantPeer(ctx, c, cs, a, ttl)
	if err != nil {
		return nil, time.Time{}, err
	}
	if server == "" {
		server = cfg.Host
	}
	ca, err := kube.CAData(cfg)
	if err != nil {
		return nil, time.Time{}, err
	}
	data, err := PeerKubeconfig(name, server, ca, token)
	return data, expiry, err
}

// PeerKubeconfig is a kubeconfig reaching server (verified with caData)
// with token, named for the cluster it reaches: everything inline, as a
// peer kubeconfig must be.
func PeerKubeconfig(cluster, server string, caData []byte, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	cfg.AuthInfos[cluster] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: cluster}
	cfg.CurrentContext = cluster
	if err := checkPeer(cfg); err != nil {
		return nil, err
	}
	return clientcmd.Write(*cfg)
}
