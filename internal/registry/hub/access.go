package hub

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	hubcrd "github.com/clustermap/clustermap/config/hub"
	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
)

// What a hub holds besides the members' records: the CRD, a namespace per
// clusterset, one Role its members share, and the admission policy that
// binds each record to its writer. RBAC grants a member every
// ClusterExport and Lease of its clusterset's namespace; it cannot say
// which, so the policy does: a member (ServiceAccount member-<cluster> of
// the namespace) writes, changes and deletes only the ClusterExports whose
// spec.cluster is its own, named for their spec (so no member holds a name
// another's record needs), and the Lease member-<cluster>.

// MemberRole is the Role every member of a clusterset is bound to, and
// PolicyName the admission policy (and its binding).
const (
	MemberRole = "clustermap-member"
	PolicyName = "clustermap-hub-members"
	// memberPrefix starts every member's ServiceAccount (and Lease) name.
	memberPrefix = "member-"
	// LabelRegion, on a member's ServiceAccount, is the Region the hub's
	// admin said the member is in (hub join --region): members read it,
	// and cannot write it.
	LabelRegion = "hub.clustermap.io/region"
)

// Init installs on the hub that cfg reaches (as an admin) what a
// clusterset's members need: the ClusterExport CRD, the clusterset's
// namespace, the members' Role and the admission policy. It is safe to
// run again (an upgrade).
func Init(ctx context.Context, cfg *rest.Config, clusterSet string) error {
	s := Scheme()
	_ = apiextensionsv1.AddToScheme(s) // a static registration: cannot fail
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(hubcrd.CRD, crd); err != nil {
		return fmt.Errorf("the embedded ClusterExport CRD: %w", err)
	}
	ns := Namespace(clusterSet)
	objs := []client.Object{crd, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Annotations: map[string]string{"hub.clustermap.io/clusterset": clusterSet}}},
		memberRole(ns), policy(), policyBinding()}
	for _, o := range objs {
		if err := kube.Upsert(ctx, c, o); err != nil {
			return fmt.Errorf("%T %s on the hub: %w", o, client.ObjectKeyFromObject(o), err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
			return false, err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

func memberRole(ns string) *rbacv1.Role {
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MemberRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"hub.clustermap.io"}, Resources: []string{"clusterexports"}, Verbs: verbs},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: verbs},
		// Every member's Region, on its ServiceAccount: read only.
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"get", "list", "watch"}},
	}}
}

// policy binds each record to the member it names; see the top of this
// file.
func policy() *admissionregistrationv1.ValidatingAdmissionPolicy {
	rule := func(group, resource string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource}},
		}}
	}
	owns := func(obj, test string) string { return obj + ` == null || ` + test }
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
				rule("hub.clustermap.io", "clusterexports"), rule("coordination.k8s.io", "leases")}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "member", Expression: `request.userInfo.username.startsWith('system:serviceaccount:') && ` +
				`request.userInfo.username.split(':').size() == 4 && request.userInfo.username.split(':')[3].startsWith('` + memberPrefix + `')`}},
			Variables: []admissionregistrationv1.Variable{
				{Name: "member", Expression: `request.userInfo.username.split(':')[3].substring(` + strconv.Itoa(len(memberPrefix)) + `)`},
			},
			Validations: []admissionregistrationv1.Validation{
				{
					Expression: `request.resource.resource != 'clusterexports' || ((` + owns("object", "object.spec.cluster == variables.member") + `) && (` +
						owns("oldObject", "oldObject.spec.cluster == variables.member") + `))`,
					MessageExpression: `'member ' + variables.member + ' writes only the ClusterExports of cluster ' + variables.member`,
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: `request.resource.resource != 'clusterexports' || object == null || object.metadata.name == ` +
						`object.spec.service['namespace'] + '.' + object.spec.service.name + '.' + object.spec.cluster + '.' + string(object.spec.chunk)`,
					Message: "a ClusterExport's name is <service namespace>.<service name>.<cluster>.<chunk>",
					Reason:  ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        `request.resource.resource != 'leases' || request.name == '` + memberPrefix + `' + variables.member`,
					MessageExpression: `'member ' + variables.member + ' writes only the Lease ` + memberPrefix + `' + variables.member`,
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
			},
		},
	}
}

func policyBinding() *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: PolicyName, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
}

// MinTokenLifetime is the shortest token the API server issues.
const MinTokenLifetime = 10 * time.Minute

// Join makes cluster a member of clusterSet on the hub that cfg reaches
// (as an admin; Init first): its ServiceAccount, bound to the members'
// Role, and a kubeconfig for it that reaches the hub at server (cfg's
// when empty), in the clusterset's namespace, with a token valid for ttl
// (or less, where the hub caps tokens). region, when set, is the Region
// the member is in, which every member reads (LabelRegion) for local-first
// routing: the hub vouches for it, not the member. It returns the
// kubeconfig and when its token expires; run again before then for a new
// one.
func Join(ctx context.Context, cfg *rest.Config, clusterSet, cluster, region, server string, ttl time.Duration) ([]byte, time.Time, error) {
	if err := clusterid.Validate(clusterid.Identity{ClusterID: cluster, ClusterSet: clusterSet}); err != nil {
		return nil, time.Time{}, err
	}
	var labels map[string]string
	if region != "" {
		if errs := validation.IsDNS1123Label(region); len(errs) > 0 {
			return nil, time.Time{}, fmt.Errorf("region %q: %s", region, strings.Join(errs, "; "))
		}
		labels = map[string]string{LabelRegion: region}
	}
	if ttl < MinTokenLifetime {
		return nil, time.Time{}, fmt.Errorf("a token lifetime of %v is below the API server's minimum of %v", ttl, MinTokenLifetime)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, time.Time{}, err
	}
	ns, sa := Namespace(clusterSet), memberPrefix+cluster
	if err := c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}); err != nil {
		return nil, time.Time{}, fmt.Errorf("the hub's namespace %s of clusterset %s: %w (run clustermap hub init first)", ns, clusterSet, err)
	}
	for _, o := range []client.Object{
		// Applied: a join without a Region takes the last one's away.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa, Labels: labels}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: MemberRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}},
	} {
		if err := kube.Upsert(ctx, c, o); err != nil {
			return nil, time.Time{}, fmt.Errorf("%T %s on the hub: %w", o, client.ObjectKeyFromObject(o), err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, time.Time{}, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl / time.Second))}}, metav1.CreateOptions{})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("token for ServiceAccount %s/%s: %w", ns, sa, err)
	}
	if server == "" {
		server = cfg.Host
	}
	ca, err := kube.CAData(cfg)
	if err != nil {
		return nil, time.Time{}, err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["hub"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["hub"] = &clientcmdapi.Context{Cluster: "hub", AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = "hub"
	if problems := kube.KubeconfigProblems(kc); len(problems) > 0 {
		return nil, time.Time{}, fmt.Errorf("the member kubeconfig would not stand on its own (%s): members must reach the hub over verified https://", strings.Join(problems, "; "))
	}
	data, err := clientcmd.Write(*kc)
	return data, tr.Status.ExpirationTimestamp.Time, err
}

// Leave deletes a member's ServiceAccount (every token issued for it goes
// with it) and binding; its records stay until forget-cluster.
func Leave(ctx context.Context, c client.Client, clusterSet, cluster string) error {
	ns, sa := Namespace(clusterSet), memberPrefix+cluster
	for _, o := range []client.Object{&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}} {
		if err := client.IgnoreNotFound(c.Delete(ctx, o)); err != nil {
			return err
		}
	}
	return nil
}

// Forget removes a member gone for good from the hub that cfg reaches (as
// an admin): its ClusterExports (every importer then drops it), its Lease,
// and its access (Leave). It refuses a member whose Lease the hub saw
// renewed within silentAfter (the hub's own clock: the Lease's
// managed-fields time), unless force. It returns how many ClusterExports
// went.
func Forget(ctx context.Context, cfg *rest.Config, clusterSet, cluster string, silentAfter time.Duration, force bool) (int, error) {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return 0, err
	}
	ns := Namespace(clusterSet)
	lease := &coordinationv1.Lease{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: LeaseName(cluster)}, lease); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return 0, fmt.Errorf("reading the Lease of %s on the hub: %w", cluster, err)
	default:
		var renewed time.Time
		for _, m := range lease.ManagedFields {
			if m.Time != nil && m.Time.After(renewed) {
				renewed = m.Time.Time
			}
		}
		if since := time.Since(renewed); !force && since < silentAfter {
			return 0, fmt.Errorf("cluster %s proved alive %v ago (within --silent-cluster-ttl %v): it is not gone; --force forgets it anyway", cluster, since.Round(time.Second), silentAfter)
		}
	}
	list := &hubv1alpha1.ClusterExportList{}
	if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{hubv1alpha1.ClusterLabel: cluster}); err != nil {
		return 0, err
	}
	n := 0
	for i := range list.Items {
		if list.Items[i].Spec.Cluster != cluster {
			continue
		}
		if err := client.IgnoreNotFound(c.Delete(ctx, &list.Items[i])); err != nil {
			return n, err
		}
		n++
	}
	if lease.Name != "" {
		if err := client.IgnoreNotFound(c.Delete(ctx, lease)); err != nil {
			return n, err
		}
	}
	return n, Leave(ctx, c, clusterSet, cluster)
}
