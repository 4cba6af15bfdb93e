package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// ErrRefused wraps every reason a token does not make its bearer a member.
var ErrRefused = errors.New("kubernetes token refused")

// MemberKind is what a verified pod may join as.
type MemberKind int

const (
	// MemberNode is a pod of the node agents' DaemonSet: it joins as the
	// node its pod is bound to.
	MemberNode MemberKind = iota + 1
	// MemberRouter is a pod of the routers' Deployment: it joins as a
	// router client named after the pod.
	MemberRouter
)

// Member is what a verified token's pod may join as.
type Member struct {
	Kind MemberKind
	// Name is the member's name: the Node's for a node agent, the pod's
	// for a router.
	Name string
	// Pod is NAMESPACE/NAME/UID of the token's pod.
	Pod string
}

// Token review's extra keys for a token bound to a pod.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// unavailable wraps a failed call to the API server: the join may be
// retried.
func unavailable(what string, err error) error {
	return errdefs.Errorf(errdefs.ErrUnavailable, "kubernetes: %s: %v", what, err)
}

// VerifyMember asks the API server who token belongs to (TokenReview,
// for the configured audience) and admits it only as a pod, still
// running under the token's ServiceAccount, of the node agents' DaemonSet
// or the routers' Deployment in the configured namespace. Every refusal
// wraps ErrRefused and says why.
func (c *Cluster) VerifyMember(ctx context.Context, token string) (Member, error) {
	review, err := c.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{c.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Member{}, unavailable("token review", err)
	}
	st := review.Status
	if !st.Authenticated {
		return Member{}, refused("the API server does not accept the token for audience %q (expired, revoked, of a deleted pod, or issued for another audience): %s", c.cfg.Audience, st.Error)
	}
	if !slices.Contains(st.Audiences, c.cfg.Audience) {
		return Member{}, refused("the token is not issued for audience %q", c.cfg.Audience)
	}
	ns, sa, ok := serviceAccount(st.User.Username)
	if !ok {
		return Member{}, refused("%s is not a ServiceAccount", st.User.Username)
	}
	if ns != c.cfg.Namespace {
		return Member{}, refused("ServiceAccount %s/%s is not in namespace %s, where Torpor's members run", ns, sa, c.cfg.Namespace)
	}
	podName, podUID := extra(st.User, extraPodName), extra(st.User, extraPodUID)
	if podName == "" || podUID == "" {
		return Member{}, refused("the token of ServiceAccount %s/%s is not bound to a pod: members present their pod's projected ServiceAccount token", ns, sa)
	}
	pod, err := c.client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Member{}, refused("the token's pod %s/%s no longer exists", ns, podName)
	}
	if err != nil {
		return Member{}, unavailable("read pod "+ns+"/"+podName, err)
	}
	if string(pod.UID) != podUID {
		return Member{}, refused("the token's pod %s/%s (uid %s) was replaced by another of that name", ns, podName, podUID)
	}
	if pod.Spec.ServiceAccountName != sa {
		return Member{}, refused("pod %s/%s runs as ServiceAccount %s, not the token's %s", ns, podName, pod.Spec.ServiceAccountName, sa)
	}
	m := Member{Pod: ns + "/" + podName + "/" + podUID}
	owner := metav1.GetControllerOf(pod)
	switch {
	case owner != nil && owner.Kind == "DaemonSet" && owner.Name == c.cfg.NodeDaemonSet:
		if err := c.checkOwner(ctx, owner, sa, func(ctx context.Context) (metav1.Object, string, error) {
			ds, err := c.client.AppsV1().DaemonSets(ns).Get(ctx, owner.Name, metav1.GetOptions{})
			return ds, ds.Spec.Template.Spec.ServiceAccountName, err
		}); err != nil {
			return Member{}, err
		}
		node := pod.Spec.NodeName
		if node == "" {
			return Member{}, refused("pod %s/%s is not bound to a Node yet", ns, podName)
		}
		if bound := extra(st.User, extraNodeName); bound != "" && bound != node {
			return Member{}, refused("the token was issued on Node %s, but pod %s/%s runs on %s", bound, ns, podName, node)
		}
		m.Kind, m.Name = MemberNode, node
	case owner != nil && owner.Kind == "ReplicaSet":
		rs, err := c.client.AppsV1().ReplicaSets(ns).Get(ctx, owner.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return Member{}, refused("pod %s/%s's ReplicaSet %s no longer exists", ns, podName, owner.Name)
		}
		if err != nil {
			return Member{}, unavailable("read ReplicaSet "+ns+"/"+owner.Name, err)
		}
		if rs.UID != owner.UID {
			return Member{}, refused("pod %s/%s's ReplicaSet %s was replaced", ns, podName, owner.Name)
		}
		dep := metav1.GetControllerOf(rs)
		if dep == nil || dep.Kind != "Deployment" || dep.Name != c.cfg.RouterDeployment {
			return Member{}, refused("pod %s/%s belongs to ReplicaSet %s, which is not of Deployment %s", ns, podName, rs.Name, c.cfg.RouterDeployment)
		}
		if err := c.checkOwner(ctx, dep, sa, func(ctx context.Context) (metav1.Object, string, error) {
			d, err := c.client.AppsV1().Deployments(ns).Get(ctx, dep.Name, metav1.GetOptions{})
			return d, d.Spec.Template.Spec.ServiceAccountName, err
		}); err != nil {
			return Member{}, err
		}
		m.Kind, m.Name = MemberRouter, podName
	default:
		return Member{}, refused("pod %s/%s belongs to %s, not to DaemonSet %s (node agents) or Deployment %s (routers)", ns, podName, ownerName(owner), c.cfg.NodeDaemonSet, c.cfg.RouterDeployment)
	}
	return m, nil
}

// checkOwner refuses an owner reference whose object is gone or replaced
// (another uid: a reference names an object by uid, not by name), and a
// token of another ServiceAccount than the owner's pods run as.
func (c *Cluster) checkOwner(ctx context.Context, ref *metav1.OwnerReference, sa string, get func(context.Context) (metav1.Object, string, error)) error {
	obj, podSA, err := get(ctx)
	if apierrors.IsNotFound(err) {
		return refused("%s %s no longer exists", ref.Kind, ref.Name)
	}
	if err != nil {
		return unavailable("read "+ref.Kind+" "+ref.Name, err)
	}
	if obj.GetUID() != ref.UID {
		return refused("the pod's %s %s was replaced by another of that name", ref.Kind, ref.Name)
	}
	if podSA != sa {
		return refused("the token is of ServiceAccount %s, but %s %s runs its pods as %s", sa, ref.Kind, ref.Name, podSA)
	}
	return nil
}

func ownerName(ref *metav1.OwnerReference) string {
	if ref == nil {
		return "no controller"
	}
	return ref.Kind + " " + ref.Name
}

// serviceAccount splits system:serviceaccount:NAMESPACE:NAME.
func serviceAccount(username string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(username, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != "" && !strings.Contains(name, ":")
}

func extra(u authnv1.UserInfo, key string) string {
	if v := u.Extra[key]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// NodeExists reads from the API server whether a Node of that name
// exists: on Kubernetes, only a Node's agent registers as a node.
func (c *Cluster) NodeExists(ctx context.Context, name string) (bool, error) {
	_, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, unavailable("read Node "+name, err)
	}
	return true, nil
}

// PodExists reads from the API server whether pod NAMESPACE/NAME/UID
// still exists (the same uid).
func (c *Cluster) PodExists(ctx context.Context, pod string) (bool, error) {
	parts := strings.Split(pod, "/")
	if len(parts) != 3 {
		return false, fmt.Errorf("kubernetes: %q is not NAMESPACE/NAME/UID", pod)
	}
	p, err := c.client.CoreV1().Pods(parts[0]).Get(ctx, parts[1], metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, unavailable("read pod "+parts[0]+"/"+parts[1], err)
	}
	return string(p.UID) == parts[2], nil
}
