package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// manifests are the objects of deploy/kubernetes, by kind and name.
type manifests struct {
	namespaces  map[string]*corev1.Namespace
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    map[string]*corev1.Service
	deployments map[string]*appsv1.Deployment
	daemonSets  map[string]*appsv1.DaemonSet
	// The rest is decoded strictly and kept by kind/name.
	others map[string]bool
}

// userSecret is the Secret docs/deploy.md has the user create (it holds
// passwords, so it is not a manifest): its name and keys.
var userSecret = &corev1.Secret{
	ObjectMeta: metav1.ObjectMeta{Name: "torpor-server", Namespace: "torpor"},
	StringData: map[string]string{"PGPASSWORD": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
}

// publishedConfigMap is the ConfigMap the control plane writes its CA into
// (torpor server --kubernetes-ca-configmap).
var publishedConfigMap = &corev1.ConfigMap{
	ObjectMeta: metav1.ObjectMeta{Name: "torpor-ca", Namespace: "torpor"},
	Data:       map[string]string{"ca.pem": ""},
}

// readManifests decodes every document strictly into its Kubernetes type:
// a field the type does not have, or a value of the wrong type, fails.
func readManifests(t *testing.T) manifests {
	t.Helper()
	m := manifests{map[string]*corev1.Namespace{}, map[string]*corev1.ConfigMap{"torpor-ca": publishedConfigMap}, map[string]*corev1.Secret{"torpor-server": userSecret},
		map[string]*corev1.Service{}, map[string]*appsv1.Deployment{}, map[string]*appsv1.DaemonSet{}, map[string]bool{}}
	files := kustomizationResources(t)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			where := fmt.Sprintf("%s#%d", file, i)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj any
			var keep func()
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				obj, keep = decodeInto(m.namespaces)
			case "v1 ConfigMap":
				obj, keep = decodeInto(m.configMaps)
			case "v1 Secret":
				obj, keep = decodeInto(m.secrets)
			case "v1 Service":
				obj, keep = decodeInto(m.services)
			case "apps/v1 Deployment":
				obj, keep = decodeInto(m.deployments)
			case "apps/v1 DaemonSet":
				obj, keep = decodeInto(m.daemonSets)
			case "v1 ServiceAccount":
				obj, keep = decodeOther[corev1.ServiceAccount](m.others, tm.Kind)
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				obj, keep = decodeOther[rbacv1.ClusterRole](m.others, tm.Kind)
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				obj, keep = decodeOther[rbacv1.ClusterRoleBinding](m.others, tm.Kind)
			case "rbac.authorization.k8s.io/v1 Role":
				obj, keep = decodeOther[rbacv1.Role](m.others, tm.Kind)
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				obj, keep = decodeOther[rbacv1.RoleBinding](m.others, tm.Kind)
			case "policy/v1 PodDisruptionBudget":
				obj, keep = decodeOther[policyv1.PodDisruptionBudget](m.others, tm.Kind)
			default:
				t.Fatalf("%s: unexpected %s %s", where, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			keep()
		}
	}
	return m
}

// kustomizationResources are the files kustomization.yaml lists, which
// must be every other manifest of the directory.
func kustomizationResources(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("kubernetes", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Namespace  string   `json:"namespace"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.Kind != "Kustomization" || k.Namespace != "torpor" {
		t.Fatalf("kustomization.yaml: kind %q namespace %q, want a Kustomization of namespace torpor", k.Kind, k.Namespace)
	}
	all, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, r := range k.Resources {
		files = append(files, filepath.Join("kubernetes", r))
	}
	for _, f := range all {
		if filepath.Base(f) != "kustomization.yaml" && !slices.Contains(files, f) {
			t.Errorf("%s is not among kustomization.yaml's resources", f)
		}
	}
	return files
}

// decodeOther returns a new T to decode into and what records it by kind
// and name once decoded.
func decodeOther[T any, P interface {
	*T
	GetName() string
}](others map[string]bool, kind string) (any, func()) {
	obj := P(new(T))
	return obj, func() { others[kind+"/"+obj.GetName()] = true }
}

// decodeInto returns a new object to decode into and what stores it in
// byName once decoded.
func decodeInto[T any, P interface {
	*T
	GetName() string
}](byName map[string]*T) (any, func()) {
	obj := P(new(T))
	return obj, func() { byName[obj.GetName()] = obj }
}

// TestKubernetesManifests decodes the manifests into the Kubernetes API's
// types (strictly) and checks what the API server would not: that they
// fit together (references, selectors, ports, variables) and that every
// container runs a torpor role with flags that role has.
func TestKubernetesManifests(t *testing.T) {
	m := readManifests(t)
	if m.namespaces["torpor"] == nil {
		t.Fatal("no namespace torpor")
	}
	if m.deployments["torpor-server"] == nil || m.deployments["torpor-router"] == nil || m.daemonSets["torpor-node"] == nil {
		t.Fatalf("want Deployments torpor-server and torpor-router and DaemonSet torpor-node, have %v %v", keys(m.deployments), keys(m.daemonSets))
	}
	if m.services["torpor-server"] == nil || m.services["torpor-router"] == nil {
		t.Fatalf("want Services torpor-server and torpor-router, have %v", keys(m.services))
	}
	type workload struct {
		kind, name string
		meta       metav1.ObjectMeta
		selector   *metav1.LabelSelector
		pod        corev1.PodTemplateSpec
	}
	var workloads []workload
	for name, d := range m.deployments {
		workloads = append(workloads, workload{"Deployment", name, d.ObjectMeta, d.Spec.Selector, d.Spec.Template})
	}
	for name, d := range m.daemonSets {
		workloads = append(workloads, workload{"DaemonSet", name, d.ObjectMeta, d.Spec.Selector, d.Spec.Template})
	}
	flags := map[string]map[string]bool{}
	for _, w := range workloads {
		where := w.kind + " " + w.name
		if w.meta.Namespace != "torpor" {
			t.Errorf("%s: namespace %q, want torpor", where, w.meta.Namespace)
		}
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(w.pod.Labels)) {
			t.Errorf("%s: selector %v does not select its pods (%v, %v)", where, w.selector, w.pod.Labels, err)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range w.pod.Spec.Volumes {
			volumes[v.Name] = v
			if v.Secret != nil && m.secrets[v.Secret.SecretName] == nil {
				t.Errorf("%s: volume %s: no Secret %s", where, v.Name, v.Secret.SecretName)
			}
		}
		for _, c := range w.pod.Spec.Containers {
			where := where + " container " + c.Name
			if c.Image != "torpor:latest" || len(c.Args) == 0 {
				t.Fatalf("%s: image %q args %q, want torpor:latest running a role", where, c.Image, c.Args)
			}
			role := c.Args[0]
			if flags[role] == nil {
				flags[role] = flagsOf(t, role)
			}
			checkArgs(t, where, role, c.Args[1:], flags[role])
			vars := envOf(t, m, where, c)
			for _, ref := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(strings.Join(c.Args, " "), -1) {
				if !vars[ref[1]] {
					t.Errorf("%s: $(%s) is in no env or envFrom", where, ref[1])
				}
			}
			for _, vm := range c.VolumeMounts {
				if _, ok := volumes[vm.Name]; !ok {
					t.Errorf("%s: mounts volume %s, which the pod has not", where, vm.Name)
				}
			}
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if probe != nil && probe.HTTPGet != nil && !ports[probe.HTTPGet.Port.StrVal] {
					t.Errorf("%s: probe on port %q, which the container does not name", where, probe.HTTPGet.Port.String())
				}
			}
			for _, svc := range m.services {
				if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
					continue
				}
				for _, p := range svc.Spec.Ports {
					if !ports[p.TargetPort.StrVal] {
						t.Errorf("Service %s: target port %q is not a port of %s", svc.Name, p.TargetPort.String(), where)
					}
				}
			}
		}
	}
	for name, svc := range m.services {
		selected := false
		for _, w := range workloads {
			selected = selected || labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.pod.Labels))
		}
		if !selected || len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s selects no workload", name)
		}
	}
	// The node agent makes sandboxes, namespaces and nftables rules on the
	// host, and workers' addresses are on the host's bridge.
	node := m.daemonSets["torpor-node"].Spec.Template.Spec
	if !node.HostNetwork || node.Containers[0].SecurityContext == nil || node.Containers[0].SecurityContext.Privileged == nil || !*node.Containers[0].SecurityContext.Privileged {
		t.Error("DaemonSet torpor-node: want hostNetwork and a privileged container")
	}
	// Routers reach workloads through the nodes' slot gates, so they run
	// anywhere; node agents join as their Node with their pod's token.
	if m.deployments["torpor-router"].Spec.Template.Spec.HostNetwork {
		t.Error("Deployment torpor-router: hostNetwork, want the pod network (it reaches every node's slot gate)")
	}
	if args := strings.Join(node.Containers[0].Args, " "); !strings.Contains(args, "--gate-listen=$(NODE_IP):") || !strings.Contains(args, "--kubernetes-token-file=") {
		t.Errorf("DaemonSet torpor-node: args %q, want --gate-listen on the node's address and --kubernetes-token-file", args)
	}
	for _, want := range []string{"ServiceAccount/torpor-server", "ServiceAccount/torpor-node", "ServiceAccount/torpor-router", "ClusterRole/torpor-server",
		"ClusterRoleBinding/torpor-server", "Role/torpor-server", "RoleBinding/torpor-server", "PodDisruptionBudget/torpor-server", "PodDisruptionBudget/torpor-router"} {
		if !m.others[want] {
			t.Errorf("no %s among the manifests", want)
		}
	}
	for _, w := range workloads {
		for _, c := range w.pod.Spec.Containers {
			if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s %s container %s: want readiness and liveness probes and CPU and memory requests", w.kind, w.name, c.Name)
			}
		}
	}
}

// envOf is the variables a container has (env and envFrom), checking that
// what they name exists.
func envOf(t *testing.T, m manifests, where string, c corev1.Container) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, e := range c.Env {
		vars[e.Name] = true
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			s := m.secrets[ref.SecretKeyRef.Name]
			if _, ok := s.StringData[ref.SecretKeyRef.Key]; s == nil || !ok {
				t.Errorf("%s: env %s: no key %s in Secret %s", where, e.Name, ref.SecretKeyRef.Key, ref.SecretKeyRef.Name)
			}
		}
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm := m.configMaps[from.ConfigMapRef.Name]
			if cm == nil {
				t.Errorf("%s: no ConfigMap %s", where, from.ConfigMapRef.Name)
				continue
			}
			for k := range cm.Data {
				vars[k] = true
			}
		case from.SecretRef != nil:
			s := m.secrets[from.SecretRef.Name]
			if s == nil {
				t.Errorf("%s: no Secret %s", where, from.SecretRef.Name)
				continue
			}
			for k := range s.StringData {
				vars[k] = true
			}
		}
	}
	return vars
}

func keys[T any](m map[string]T) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
