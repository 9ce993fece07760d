package node

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeRBACName is the ClusterRoleBinding EnsureRBAC creates.
const NodeRBACName = "proxyplane-e2e-nodes"

// EnsureRBAC binds RBAC's built-in system:node ClusterRole to the group
// system:nodes. A real cluster authorizes kubelets with the Node
// authorizer (and NodeRestriction admission), which narrows each kubelet
// to its own Node and pods; the box's API server runs RBAC alone
// (--authorization-mode=RBAC), under which system:node, bound so, is the
// kubelet's documented fallback. client must be allowed to create
// ClusterRoleBindings (admin).
func EnsureRBAC(ctx context.Context, client kubernetes.Interface) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: NodeRBACName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}
	_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding system:node to system:nodes: %w", err)
	}
	return nil
}
