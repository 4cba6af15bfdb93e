package validate

import (
	"errors"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestTemplateProbes(t *testing.T) {
	template := func(probe *torporv1.Probe) *torporv1.Template {
		return &torporv1.Template{
			Metadata: &torporv1.ObjectMeta{Space: "default", Name: "kv"},
			Spec: &torporv1.TemplateSpec{Containers: []*torporv1.Container{
				{Name: "kv", Image: "kv@sha256:0", Command: []string{"/kv"}, ReadinessProbe: probe},
			}},
		}
	}
	cases := []struct {
		name  string
		probe *torporv1.Probe
		field string // "" for a valid probe
	}{
		{"none", nil, ""},
		{"httpGet", &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Port: 8080}}, ""},
		{"tcpSocket with period", &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{Port: 6379}, PeriodSeconds: 2, TimeoutSeconds: 10}, ""},
		{"exec", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/kv", "ping"}}}, ""},
		{"no action", &torporv1.Probe{TimeoutSeconds: 5}, "spec.containers[0].readinessProbe"},
		{"two actions", &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Port: 8080}, TcpSocket: &torporv1.TCPSocketAction{Port: 8080}}, "spec.containers[0].readinessProbe"},
		{"httpGet port", &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Port: 70000}}, "spec.containers[0].readinessProbe.httpGet.port"},
		{"tcpSocket port", &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{}}, "spec.containers[0].readinessProbe.tcpSocket.port"},
		{"exec without command", &torporv1.Probe{Exec: &torporv1.ExecAction{}}, "spec.containers[0].readinessProbe.exec.command"},
		{"exec with empty program", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"", "ping"}}}, "spec.containers[0].readinessProbe.exec.command"},
		{"negative timeout", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/kv"}}, TimeoutSeconds: -1}, "spec.containers[0].readinessProbe.timeoutSeconds"},
		{"negative period", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/kv"}}, PeriodSeconds: -1}, "spec.containers[0].readinessProbe.periodSeconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Template(template(tc.probe), nil)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid probe refused: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path != tc.field {
				t.Fatalf("Template() = %v, want a field error at %s", err, tc.field)
			}
		})
	}
}

func TestTemplateContainersShareVolumes(t *testing.T) {
	tmpl := &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "pod"},
		Spec: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{
				{Name: "counter", Image: "counter@sha256:0", Command: []string{"/counter"}, Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}}},
				{Name: "sidecar", Image: "pod@sha256:0", Command: []string{"/sidecar"}, Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data", ReadOnly: true}}},
			},
			Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
		},
	}
	if err := Template(tmpl, nil); err != nil {
		t.Fatalf("two containers mounting one volume refused: %v", err)
	}
}
