package e2e

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/kube/kubetest"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// kubeInstall is Torpor as deploy/kubernetes installs it, on a real API
// server with kwok's fake Nodes: the manifests applied, and the processes
// the cluster would run (control-plane replicas, node agents, routers)
// running on this host with the identities the cluster gives their pods.
type kubeInstall struct {
	t    *testing.T
	ctx  context.Context
	kc   *kubetest.Cluster
	kube kubernetes.Interface
	dir  string
	// caFile is the CA the control plane published in ConfigMap
	// torpor-ca, as members mount it.
	caFile string
}

const torporNS = "torpor"

// kubectl runs the cluster's kubectl as its admin.
func (k *kubeInstall) kubectl(args ...string) string {
	k.t.Helper()
	out, err := exec.Command(k.kc.Kubectl, append([]string{"--kubeconfig", k.kc.Kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// podOf makes a pod of the workload's pod template, owned by owner and
// bound to node, as its controller and the scheduler would.
func (k *kubeInstall) podOf(name, node string, tmpl corev1.PodTemplateSpec, owner metav1.OwnerReference) *corev1.Pod {
	k.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: torporNS, Labels: tmpl.Labels, OwnerReferences: []metav1.OwnerReference{owner}}, Spec: tmpl.Spec}
	pod.Spec.NodeName = node
	created, err := k.kube.CoreV1().Pods(torporNS).Create(k.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

func controller(apiVersion, kind string, obj metav1.Object) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: obj.GetName(), UID: obj.GetUID(), Controller: &yes}
}

// token is a ServiceAccount token the TokenRequest API issues, bound to
// pod when it is given, written to a file as the kubelet projects it.
func (k *kubeInstall) token(ns, sa, audience string, pod *corev1.Pod) (value, file string) {
	k.t.Helper()
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	if pod != nil {
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	resp, err := k.kube.CoreV1().ServiceAccounts(ns).CreateToken(k.ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("token of %s/%s: %v", ns, sa, err)
	}
	f, err := os.CreateTemp(k.dir, "token-")
	if err != nil {
		k.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(resp.Status.Token); err != nil {
		k.t.Fatal(err)
	}
	return resp.Status.Token, f.Name()
}

// waitFor polls cond for up to limit.
func (k *kubeInstall) waitFor(what string, limit time.Duration, cond func() bool) {
	k.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKubernetes installs Torpor on a real API server as docs/deploy.md
// does and runs it as the cluster would: two control-plane replicas on
// PostgreSQL verifying members with the API server, two node agents on
// this host as the agents of two kwok Nodes, two routers, none with a
// join token. Then the cluster drives the nodes: a cordon stops
// placements, a drain moves actors with their state, a deleted Node's
// actors recover at once; and every hostile token is refused.
func TestKubernetes(t *testing.T) {
	runtimetest.RequireRoot(t)
	k := &kubeInstall{t: t, ctx: context.Background(), kc: kubetest.Start(t), dir: t.TempDir()}
	k.kube = k.kc.Clientset()
	root, err := runtimetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}

	// The manifests as a user applies them (the Secret first: it holds
	// passwords, so it is no manifest), read back, and again as a
	// server-side dry run, which the API server validates in full.
	manifests := filepath.Join(root, "deploy", "kubernetes")
	k.kubectl("create", "namespace", torporNS)
	k.kubectl("-n", torporNS, "create", "secret", "generic", "torpor-server", "--from-literal=PGPASSWORD=x", "--from-literal=AWS_ACCESS_KEY_ID=x", "--from-literal=AWS_SECRET_ACCESS_KEY=x")
	k.kubectl("apply", "-k", manifests)
	if out := k.kubectl("apply", "-k", manifests, "--dry-run=server"); !strings.Contains(out, "daemonset.apps/torpor-node") || !strings.Contains(out, "server dry run") {
		t.Fatalf("server-side dry run:\n%s", out)
	}
	ds, err := k.kube.AppsV1().DaemonSets(torporNS).Get(k.ctx, "torpor-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	routers, err := k.kube.AppsV1().Deployments(torporNS).Get(k.ctx, "torpor-router", metav1.GetOptions{})
	if err != nil || *routers.Spec.Replicas < 2 {
		t.Fatalf("Deployment torpor-router: %v, want 2 replicas (%v)", routers.Spec.Replicas, err)
	}

	// The control plane, as ServiceAccount torpor-server with the RBAC of
	// the manifests, two replicas on one PostgreSQL database.
	serverToken, _ := k.token(torporNS, "torpor-server", "", nil)
	kubeconfig := k.kc.KubeconfigFor(serverToken)
	db := storetest.URL(t, "postgres")
	snapshots := t.TempDir()
	replica := func() *cluster {
		t.Helper()
		_, conn := serverProcess(t, t.TempDir(), testkit.FreeAddr(t), "--store", db, "--snapshots", snapshots,
			"--kubernetes", "--kubeconfig", kubeconfig, "--heartbeat-timeout", "5m")
		c := apiCluster(t, conn)
		c.snapshotStorage = snapshots
		return c
	}
	r1, r2 := replica(), replica()

	// The CA the control plane published, as members mount it.
	k.waitFor("ConfigMap torpor-ca", time.Minute, func() bool {
		cm, err := k.kube.CoreV1().ConfigMaps(torporNS).Get(k.ctx, "torpor-ca", metav1.GetOptions{})
		return err == nil && cm.Data["ca.pem"] == string(r1.conn.CA)
	})
	k.caFile = filepath.Join(k.dir, "ca.pem")
	if err := os.WriteFile(k.caFile, r1.conn.CA, 0o600); err != nil {
		t.Fatal(err)
	}

	// Two Nodes, each with its node agent's pod; the agents join with
	// their pods' tokens as their Nodes, each through its own replica.
	workerLabels := map[string]string{"torpor.dev/workers": "true"}
	nodePods := map[string]*corev1.Pod{}
	agents := map[string]*nodeProcess{}
	for i, name := range []string{"kn-a", "kn-b"} {
		k.kc.AddNode(name, workerLabels)
		nodePods[name] = k.podOf("torpor-node-"+name, name, ds.Spec.Template, controller("apps/v1", "DaemonSet", ds))
		_, file := k.token(torporNS, "torpor-node", "torpor.dev", nodePods[name])
		agents[name] = []*cluster{r1, r2}[i].startNodeProcessAs(name, 2, "--kubernetes-token-file", file, "--ca", k.caFile)
	}
	r1.waitForWorkers("kn-b", 2)

	// Two routers of the Deployment (through its ReplicaSet), on either
	// Node, each named after its pod.
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "torpor-router-6d4f", Namespace: torporNS, Labels: routers.Spec.Template.Labels, OwnerReferences: []metav1.OwnerReference{controller("apps/v1", "Deployment", routers)}},
		Spec:       appsv1.ReplicaSetSpec{Selector: routers.Spec.Selector, Template: routers.Spec.Template},
	}
	if rs, err = k.kube.AppsV1().ReplicaSets(torporNS).Create(k.ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ingresses []string
	var routerPods []*corev1.Pod
	for i, node := range []string{"kn-a", "kn-b"} {
		pod := k.podOf(fmt.Sprintf("torpor-router-6d4f-%d", i), node, routers.Spec.Template, controller("apps/v1", "ReplicaSet", rs))
		routerPods = append(routerPods, pod)
		_, file := k.token(torporNS, "torpor-router", "torpor.dev", pod)
		listen := testkit.FreeAddr(t)
		p := startProcess(t, pod.Name, "router", "--name", pod.Name, "--server", []*cluster{r1, r2}[i].api,
			"--kubernetes-token-file", file, "--ca", k.caFile, "--state-dir", t.TempDir(), "--listen", listen)
		k.waitFor("router "+pod.Name+" listening", time.Minute, func() bool {
			if !p.running() {
				t.Fatalf("router %s exited:\n%s", pod.Name, tail(p.logPath, 4<<10))
			}
			conn, err := net.Dial("tcp", listen)
			if err == nil {
				conn.Close()
			}
			return err == nil
		})
		ingresses = append(ingresses, "http://"+listen)
	}
	through := func(ingress, actor string) string {
		t.Helper()
		r1.ingress = ingress
		code, _, body := r1.routerGet(actor)
		if code != http.StatusOK {
			t.Fatalf("GET %s through %s: %d %s", actor, ingress, code, body)
		}
		return body
	}

	r1.applyTemplate(counterTemplate(t, "counter", nil))
	r1.createActor("ka", "counter")
	r1.createActor("kb", "counter")
	nodeOf := func(name string) string { return r1.actor(name).GetStatus().GetWorker().GetNode() }
	torporNode := func(name string) *torporv1.Node {
		resp, err := r1.nodeClient().GetNode(k.ctx, connect.NewRequest(&torporv1.GetRequest{Name: name}))
		if err != nil {
			return nil
		}
		return resp.Msg
	}
	setUnschedulable := func(node string, on bool) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
		if _, err := k.kube.CoreV1().Nodes().Patch(k.ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		k.waitFor(fmt.Sprintf("node %s cordoned=%v", node, on), 30*time.Second, func() bool {
			n := torporNode(node)
			return n != nil && n.GetCordoned() == on
		})
	}

	// Cordons steer placement: ka only fits on kn-a while kn-b is
	// cordoned, kb on kn-b while kn-a is.
	setUnschedulable("kn-b", true)
	if got := through(ingresses[0], "ka"); got != "count=1 lines=1" || nodeOf("ka") != "kn-a" {
		t.Fatalf("ka with kn-b cordoned: %q on %s, want count=1 on kn-a", got, nodeOf("ka"))
	}
	if n := torporNode("kn-b"); !strings.Contains(n.GetCordonReason(), "cordoned") {
		t.Errorf("cordon reason %q does not say why", n.GetCordonReason())
	}
	setUnschedulable("kn-b", false)
	setUnschedulable("kn-a", true)
	if got := through(ingresses[1], "kb"); got != "count=1 lines=1" || nodeOf("kb") != "kn-b" {
		t.Fatalf("kb with kn-a cordoned: %q on %s, want count=1 on kn-b", got, nodeOf("kb"))
	}
	setUnschedulable("kn-a", false)

	// Every router reaches the actors of every node.
	for i, ingress := range ingresses {
		for _, actor := range []string{"ka", "kb"} {
			if got, want := through(ingress, actor), fmt.Sprintf("count=%d lines=%d", i+2, i+2); got != want {
				t.Fatalf("%s through router %d: %q, want %q", actor, i, got, want)
			}
		}
	}

	// A drain (the taint) suspends kn-a's actors to storage; ka resumes
	// on kn-b with its state.
	taint := `{"spec":{"taints":[{"key":"torpor.dev/drain","effect":"NoSchedule"}]}}`
	if _, err := k.kube.CoreV1().Nodes().Patch(k.ctx, "kn-a", types.MergePatchType, []byte(taint), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitFor("ka suspended by the drain of kn-a", time.Minute, func() bool {
		return r1.actor("ka").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
	})
	if n := torporNode("kn-a"); !n.GetDraining() {
		t.Errorf("kn-a while its Node has the drain taint: %v, want draining", n)
	}
	if got := through(ingresses[0], "ka"); got != "count=4 lines=4" || nodeOf("ka") != "kn-b" {
		t.Fatalf("ka after the drain: %q on %s, want count=4 on kn-b", got, nodeOf("ka"))
	}
	drained := r1.actor("ka").GetStatus().GetLatestSnapshot()

	// The Node kn-b deleted: its actors crash at once (the heartbeat
	// timeout is 5 minutes) and its agent may not register again.
	if _, err := k.kube.CoreV1().Nodes().Patch(k.ctx, "kn-a", types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitFor("kn-a back in service", 30*time.Second, func() bool { n := torporNode("kn-a"); return n != nil && !n.GetCordoned() })
	// The machine goes with its Node: its agent and sandboxes are gone.
	// (An agent that outlives its deleted Node keeps serving its old
	// workloads to a router whose placement table still names them, until
	// the router learns of the crash: see the session note.)
	agents["kn-b"].removeLeftovers(t)
	if err := k.kube.CoreV1().Nodes().Delete(k.ctx, "kn-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitFor("the actors of the deleted Node kn-b crashed", 30*time.Second, func() bool {
		return r1.actor("ka").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED &&
			r1.actor("kb").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
	})
	if reason := r1.actor("ka").GetStatus().GetCrashReason(); !strings.Contains(reason, "Kubernetes Node kn-b was deleted") {
		t.Errorf("crash reason %q does not name the deleted Node", reason)
	}
	// ka recovers on kn-a from the drain's snapshot (count 3): the
	// request served on kn-b since was in memory only.
	if got := through(ingresses[1], "ka"); got != "count=4 lines=4" || nodeOf("ka") != "kn-a" || r1.actor("ka").GetStatus().GetLatestSnapshot() != drained {
		t.Fatalf("ka after kn-b was deleted: %q on %s, want count=4 on kn-a from snapshot %s", got, nodeOf("ka"), drained)
	}
	if n := torporNode("kn-b"); n != nil {
		t.Fatalf("node kn-b still registered after its Node was deleted: %v", n)
	}

	t.Run("hostile tokens", func(t *testing.T) {
		k.t = t
		block, _ := pem.Decode(r1.conn.CA)
		caFingerprint := identity.Fingerprint(block.Bytes)
		liveRouterToken, _ := k.token(torporNS, "torpor-router", "torpor.dev", routerPods[0])
		join := func(kind identity.MemberKind, name, token string) error {
			m := &identity.Member{Kind: kind, Name: name, ServerURL: r1.api, File: filepath.Join(t.TempDir(), "creds.json"),
				CAFingerprint: caFingerprint, KubernetesToken: func(context.Context) (string, error) { return token, nil }, Logger: testLogger()}
			ctx, cancel := context.WithTimeout(k.ctx, 30*time.Second)
			defer cancel()
			_, err := m.Join(ctx)
			return err
		}
		intruder := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "intruder", Namespace: torporNS}}
		if _, err := k.kube.CoreV1().ServiceAccounts(torporNS).Create(k.ctx, intruder, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		forged := ds.Spec.Template
		forged.Spec.ServiceAccountName = "intruder"
		forgedPod := k.podOf("forged-node", "kn-a", forged, controller("apps/v1", "DaemonSet", ds))
		loose := k.podOf("loose", "kn-a", forged, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "torpor", UID: "x"})
		k.kubectl("create", "namespace", "other")
		k.kubectl("-n", "other", "create", "serviceaccount", "torpor-node")
		otherTmpl := ds.Spec.Template
		otherPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "other"}, Spec: otherTmpl.Spec}
		otherPod.Spec.NodeName = "kn-a"
		if otherPod, err = k.kube.CoreV1().Pods("other").Create(k.ctx, otherPod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		agentToken, _ := k.token(torporNS, "torpor-node", "torpor.dev", nodePods["kn-a"])
		forgedToken, _ := k.token(torporNS, "intruder", "torpor.dev", forgedPod)
		looseToken, _ := k.token(torporNS, "intruder", "torpor.dev", loose)
		otherToken, _ := k.token("other", "torpor-node", "torpor.dev", otherPod)
		unbound, _ := k.token(torporNS, "torpor-node", "torpor.dev", nil)
		otherAudience, _ := k.token(torporNS, "torpor-node", "other.example", nodePods["kn-a"])
		deletedRouterToken, _ := k.token(torporNS, "torpor-router", "torpor.dev", routerPods[1])
		if err := k.kube.CoreV1().Pods(torporNS).Delete(k.ctx, routerPods[1].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			t.Fatal(err)
		}
		k.waitFor("router pod deleted", time.Minute, func() bool {
			_, err := k.kube.CoreV1().Pods(torporNS).Get(k.ctx, routerPods[1].Name, metav1.GetOptions{})
			return err != nil
		})
		for _, tc := range []struct {
			name   string
			kind   identity.MemberKind
			member string
			token  string
			want   string
		}{
			{"another ServiceAccount", identity.MemberNode, "kn-a", forgedToken, "runs its pods as torpor-node"},
			{"a pod of no Torpor workload", identity.MemberNode, "kn-a", looseToken, "not to DaemonSet torpor-node"},
			{"another namespace", identity.MemberNode, "kn-a", otherToken, "not in namespace torpor"},
			{"unbound", identity.MemberNode, "kn-a", unbound, "not bound to a pod"},
			{"another audience", identity.MemberNode, "kn-a", otherAudience, `for audience "torpor.dev"`},
			{"a deleted pod's", identity.MemberClient, routerPods[1].Name, deletedRouterToken, "does not accept the token"},
			{"another Node's name", identity.MemberNode, "kn-c", agentToken, "joins as its Node, not as \"kn-c\""},
			{"a router claiming another name", identity.MemberClient, "edge", liveRouterToken, "joins as its pod's name"},
			{"garbage", identity.MemberNode, "kn-a", "not-a-token", "does not accept the token"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := join(tc.kind, tc.member, tc.token)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("join as %s %s: %v, want a refusal saying %q", tc.kind, tc.member, err, tc.want)
				}
				if code := connect.CodeOf(err); code != connect.CodeUnauthenticated && code != connect.CodePermissionDenied {
					t.Fatalf("join: code %v, want unauthenticated or permission denied", code)
				}
			})
		}
		// The deleted router pod's client goes, so its certificate no
		// longer works; the live router's stays.
		ids := torporv1connect.NewIdentityServiceClient(r1.http, r1.api)
		k.waitFor("the deleted router pod's client removed", time.Minute, func() bool {
			resp, err := ids.ListClients(k.ctx, connect.NewRequest(&torporv1.ListClientsRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range resp.Msg.GetClients() {
				names = append(names, c.GetName())
			}
			all := strings.Join(names, ",")
			return !strings.Contains(all, routerPods[1].Name) && strings.Contains(all, routerPods[0].Name)
		})
	})
}
