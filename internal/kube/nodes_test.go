package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStateOf(t *testing.T) {
	drain := corev1.Taint{Key: DrainTaint, Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "example.com/gpu", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name string
		spec corev1.NodeSpec
		want NodeState
	}{
		{"schedulable", corev1.NodeSpec{}, NodeState{}},
		{"another taint", corev1.NodeSpec{Taints: []corev1.Taint{other}}, NodeState{}},
		{"cordoned", corev1.NodeSpec{Unschedulable: true}, NodeState{Cordoned: true, Reason: "Kubernetes Node n1 is cordoned"}},
		{"drain taint", corev1.NodeSpec{Taints: []corev1.Taint{other, drain}}, NodeState{Cordoned: true, Draining: true, Reason: "Kubernetes Node n1 has taint torpor.dev/drain"}},
		{"cordoned and drained", corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{drain}}, NodeState{Cordoned: true, Draining: true, Reason: "Kubernetes Node n1 has taint torpor.dev/drain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := stateOf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: tc.spec})
			if got != tc.want {
				t.Fatalf("stateOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestServiceAccount(t *testing.T) {
	for _, tc := range []struct {
		username, ns, name string
		ok                 bool
	}{
		{"system:serviceaccount:torpor:torpor-node", "torpor", "torpor-node", true},
		{"system:serviceaccount:torpor:", "", "", false},
		{"system:serviceaccount::x", "", "", false},
		{"system:serviceaccount:a:b:c", "", "", false},
		{"system:node:n1", "", "", false},
		{"admin", "", "", false},
	} {
		ns, name, ok := serviceAccount(tc.username)
		if ok != tc.ok || ok && (ns != tc.ns || name != tc.name) {
			t.Errorf("serviceAccount(%q) = %q, %q, %v; want %q, %q, %v", tc.username, ns, name, ok, tc.ns, tc.name, tc.ok)
		}
	}
}
