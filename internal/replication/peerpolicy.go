package replication

import (
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// RBAC cannot say which objects of a kind a peer may write, so the
// API server's admission does (a ValidatingAdmissionPolicy, CEL): a
// consuming cluster's ServiceAccount, clustermap-peer-<cluster>, writes
// nothing in the system namespaces, and writes only the Services and
// EndpointSlices that carry its own cluster's mark (LabelSourceCluster).
// The one write to a Service not its own is the migration's hand-over:
// the mode annotation of the Service its replica came from, and nothing
// else of it.

// peerPolicyMatch selects a peer's requests: a ServiceAccount named
// PeerRole + "-" + cluster, in any namespace (grants may use several).
const peerPolicyMatch = `request.userInfo.username.startsWith('system:serviceaccount:') && ` +
	`request.userInfo.username.split(':').size() == 4 && ` +
	`request.userInfo.username.split(':')[3].startsWith('` + PeerRole + `-')`

// systemNamespaces are never a peer's to write in.
var systemNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

func peerPolicy(meta metav1.ObjectMeta) *admissionregistrationv1.ValidatingAdmissionPolicy {
	label := func(obj string) string {
		return obj + ` != null && has(` + obj + `.metadata.labels) && '` + LabelSourceCluster + `' in ` + obj + `.metadata.labels ? ` +
			obj + `.metadata.labels['` + LabelSourceCluster + `'] : ''`
	}
	has := func(obj, field string) string { return `has(` + obj + `.metadata.` + field + `)` }
	// The same map on both sides, or absent from both.
	same := func(field string) string {
		return `(` + has("object", field) + ` == ` + has("oldObject", field) + ` && (!` + has("object", field) + ` || object.metadata.` + field + ` == oldObject.metadata.` + field + `))`
	}
	modeKeys := `['` + AnnotationMode + `', '` + AnnotationModeAlias + `']`
	// Every annotation but the mode's the same on both sides.
	annotationsButMode := `(!` + has("object", "annotations") + ` || object.metadata.annotations.all(k, k in ` + modeKeys +
		` || (` + has("oldObject", "annotations") + ` && k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k]))) && ` +
		`(!` + has("oldObject", "annotations") + ` || oldObject.metadata.annotations.all(k, k in ` + modeKeys +
		` || (` + has("object", "annotations") + ` && k in object.metadata.annotations)))`
	ns := "['" + strings.Join(systemNamespaces, "', '") + "']"
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"", "discovery.k8s.io"}, APIVersions: []string{"*"},
						Resources: []string{"services", "endpointslices", "endpoints"}},
				}}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "peer", Expression: peerPolicyMatch}},
			Variables: []admissionregistrationv1.Variable{
				{Name: "peer", Expression: `request.userInfo.username.split(':')[3].substring(` + strconv.Itoa(len(PeerRole)+1) + `)`},
				{Name: "newMark", Expression: label("object")},
				{Name: "oldMark", Expression: label("oldObject")},
				{Name: "modeOnly", Expression: `object.spec == oldObject.spec && ` + same("labels") + ` && ` + annotationsButMode},
			},
			Validations: []admissionregistrationv1.Validation{
				{
					Expression:        `!(request.namespace in ` + ns + `)`,
					MessageExpression: `'the peer ' + variables.peer + ' may not write in ' + request.namespace + ': replication writes nothing in the system namespaces'`,
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: `request.resource.resource != 'endpointslices' || ` +
						`((request.operation == 'DELETE' || variables.newMark == variables.peer) && (request.operation == 'CREATE' || variables.oldMark == variables.peer))`,
					MessageExpression: `'the peer ' + variables.peer + ' writes only EndpointSlices labelled ` + LabelSourceCluster + `=' + variables.peer`,
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: `request.resource.resource != 'services' || ` +
						`(request.operation == 'CREATE' && variables.newMark == variables.peer) || ` +
						`(request.operation == 'DELETE' && variables.oldMark == variables.peer) || ` +
						`(request.operation == 'UPDATE' && (variables.oldMark == variables.peer || variables.modeOnly))`,
					MessageExpression: `'the peer ' + variables.peer + ' writes only Services labelled ` + LabelSourceCluster + `=' + variables.peer + ', and of others only the mode annotation (a migration)'`,
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
			},
		},
	}
}

func peerPolicyBinding(meta metav1.ObjectMeta) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        meta.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}
