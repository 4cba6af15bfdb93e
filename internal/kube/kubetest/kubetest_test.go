package kubetest_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/torpor-dev/torpor/internal/kube/kubetest"
)

const audience = "torpor.dev"

// TestCluster runs the test control plane through what Torpor's tests
// rely on: kwok's Nodes and Pods, Pod-bound ServiceAccount tokens and
// their review, kubectl, RBAC, and a stop that leaves nothing.
func TestCluster(t *testing.T) {
	began := time.Now()
	c := kubetest.Start(t)
	t.Logf("etcd, kube-apiserver and kwok started in %v", time.Since(began))
	ctx := t.Context()
	cs := c.Clientset()

	const ns = "kubetest"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := createServiceAccount(t, cs, ns, "agent")

	began = time.Now()
	node := c.AddNode("worker-1", map[string]string{"torpor.dev/workers": "true"})
	t.Logf("Node %s Ready in %v", node.Name, time.Since(began))
	if node.Labels["torpor.dev/workers"] != "true" {
		t.Errorf("Node %s labels = %v, want torpor.dev/workers=true", node.Name, node.Labels)
	}
	pod := runPod(t, cs, ns, "agent-1", sa.Name, node.Name)

	token := podToken(t, cs, pod, audience)

	t.Run("TokenReview names the ServiceAccount, the Pod and its Node", func(t *testing.T) {
		status := review(t, cs, token, audience)
		if !status.Authenticated {
			t.Fatalf("token not authenticated: %q", status.Error)
		}
		if want := "system:serviceaccount:" + ns + ":" + sa.Name; status.User.Username != want {
			t.Errorf("username = %q, want %q", status.User.Username, want)
		}
		if want := "system:serviceaccounts:" + ns; !slices.Contains(status.User.Groups, want) {
			t.Errorf("groups = %v, want %q among them", status.User.Groups, want)
		}
		if !slices.Equal(status.Audiences, []string{audience}) {
			t.Errorf("audiences = %v, want [%s]", status.Audiences, audience)
		}
		t.Logf("user.extra of a Pod-bound token: %v", status.User.Extra)
		for key, want := range map[string]string{
			"authentication.kubernetes.io/pod-name":  pod.Name,
			"authentication.kubernetes.io/pod-uid":   string(pod.UID),
			"authentication.kubernetes.io/node-name": node.Name,
			"authentication.kubernetes.io/node-uid":  string(node.UID),
		} {
			if got := status.User.Extra[key]; !slices.Equal(got, authenticationv1.ExtraValue{want}) {
				t.Errorf("extra[%s] = %v, want [%s]", key, got, want)
			}
		}
	})

	t.Run("a token for another audience is refused", func(t *testing.T) {
		other := podToken(t, cs, pod, "other")
		if status := review(t, cs, other, audience); status.Authenticated {
			t.Errorf("a token for audience \"other\" authenticated for %s as %q", audience, status.User.Username)
		}
	})

	t.Run("kubectl reads the Nodes", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, c.Kubectl, "--kubeconfig", c.Kubeconfig, "get", "nodes").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get nodes: %v: %s", err, out)
		}
		if !strings.Contains(string(out), node.Name) || !strings.Contains(string(out), "Ready") {
			t.Errorf("kubectl get nodes printed no Ready %s:\n%s", node.Name, out)
		}
	})

	t.Run("RBAC is enforced", func(t *testing.T) {
		// A token for the API server's audience: one for Torpor's is not
		// accepted there.
		apiToken := podToken(t, cs, pod, c.ServiceAccountIssuer)
		cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigFor(apiToken))
		if err != nil {
			t.Fatal(err)
		}
		asAgent := kubernetes.NewForConfigOrDie(cfg)
		_, err = asAgent.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("a ServiceAccount with no binding listed Nodes: err = %v, want Forbidden", err)
		}
		// The token is accepted: it is authorization that refuses.
		got, err := asAgent.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SelfSubjectReview with the agent's token: %v", err)
		}
		if want := "system:serviceaccount:" + ns + ":" + sa.Name; got.Status.UserInfo.Username != want {
			t.Errorf("the agent's kubeconfig authenticates as %q, want %q", got.Status.UserInfo.Username, want)
		}

		cfg, err = clientcmd.BuildConfigFromFlags("", c.KubeconfigFor(token))
		if err != nil {
			t.Fatal(err)
		}
		_, err = kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if !apierrors.IsUnauthorized(err) {
			t.Errorf("the API server with a token for audience %s: err = %v, want Unauthorized", audience, err)
		}
	})

	t.Run("a deleted Pod's token is refused", func(t *testing.T) {
		unreviewed := podToken(t, cs, pod, audience)
		pods := cs.CoreV1().Pods(ns)
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// kwok finishes the deletion a kubelet would.
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("Pod %s still there: %v", pod.Name, err)
		}
		gone := time.Now()
		if status := review(t, cs, unreviewed, audience); status.Authenticated {
			t.Errorf("a token of deleted Pod %s authenticated as %q", pod.Name, status.User.Username)
		}
		// The API server caches a token's successful authentication for
		// 10 s (not configurable), so a token reviewed before the deletion
		// still passes for up to that long.
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return !review(t, cs, token, audience).Authenticated, nil
		})
		if err != nil {
			t.Fatalf("the reviewed token of deleted Pod %s still authenticates: %v", pod.Name, err)
		}
		t.Logf("a token reviewed before its Pod was deleted passed for %v after", time.Since(gone).Round(100*time.Millisecond))
	})

	t.Run("Stop leaves nothing", func(t *testing.T) {
		host := strings.TrimPrefix(c.REST.Host, "https://")
		dir := filepath.Dir(c.Kubeconfig)
		c.Stop()
		if conn, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			conn.Close()
			t.Errorf("the API server's address %s still accepts connections after Stop", host)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the cluster's directory %s after Stop: %v, want it gone", dir, err)
		}
		// Every program of the cluster names a file in its directory.
		cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, f := range cmdlines {
			if cmdline, err := os.ReadFile(f); err == nil && strings.Contains(string(cmdline), dir) {
				t.Errorf("%s runs after Stop: %s", filepath.Dir(f), strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
		}
	})
}

func createServiceAccount(t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.ServiceAccount {
	t.Helper()
	sa, err := cs.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sa
}

// runPod creates a Pod bound to node and returns it once kwok reports it
// Running.
func runPod(t *testing.T, cs kubernetes.Interface, ns, name, serviceAccount, node string) *corev1.Pod {
	t.Helper()
	pods := cs.CoreV1().Pods(ns)
	_, err := pods.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: serviceAccount,
			Containers:         []corev1.Container{{Name: "agent", Image: "torpor:test"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err = pods.Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("Pod %s not Running: %v (last: %+v)", name, err, pod.Status)
	}
	return pod
}

// podToken asks the TokenRequest API for a token of the Pod's
// ServiceAccount bound to the Pod, for audience.
func podToken(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, audience string) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:      []string{audience},
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	got, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(t.Context(), pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for Pod %s: %v", pod.Name, err)
	}
	return got.Status.Token
}

func review(t *testing.T, cs kubernetes.Interface, token, audience string) authenticationv1.TokenReviewStatus {
	t.Helper()
	got, err := cs.AuthenticationV1().TokenReviews().Create(t.Context(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	return got.Status
}

// BenchmarkStart measures a test cluster's start (etcd healthy, the API
// server ready, kwok serving) and stop.
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		kubetest.Start(b).Stop()
	}
}
