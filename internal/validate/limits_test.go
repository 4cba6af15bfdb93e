package validate

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// goodSpec is a valid spec the cases below change one field of.
func goodSpec() *torporv1.TemplateSpec {
	return &torporv1.TemplateSpec{
		Containers: []*torporv1.Container{{
			Name: "app", Image: "app@sha256:0", Command: []string{"/app"},
			Env:    []*torporv1.EnvVar{{Name: "PORT", Value: "8080"}},
			Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}
}

func manyEnv(n, valueLen int) []*torporv1.EnvVar {
	env := make([]*torporv1.EnvVar, n)
	for i := range env {
		env[i] = &torporv1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: strings.Repeat("x", valueLen)}
	}
	return env
}

func TestTemplateSpecRules(t *testing.T) {
	tests := []struct {
		name   string
		change func(*torporv1.TemplateSpec)
		field  string // "" when valid
		reason string
	}{
		{"valid", func(*torporv1.TemplateSpec) {}, "", ""},
		{"every enum at a valid value", func(s *torporv1.TemplateSpec) {
			s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnPause: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA,
				OnResume: &torporv1.OnResume{FromData: torporv1.FromData_FROM_DATA_GOLDEN}}
			s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 60, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE}
		}, "", ""},
		{"onCommit out of range", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnCommit: 99} }, "spec.snapshotPolicy.onCommit", "99: want FULL or DATA"},
		{"onPause out of range", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnPause: 7} }, "spec.snapshotPolicy.onPause", "want FULL or DATA"},
		{"fromData out of range", func(s *torporv1.TemplateSpec) {
			s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnResume: &torporv1.OnResume{FromData: 99}}
		}, "spec.snapshotPolicy.onResume.fromData", "want COLD_BOOT or GOLDEN"},
		{"idle action out of range", func(s *torporv1.TemplateSpec) { s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 60, Action: 99} }, "spec.idlePolicy.action", "want PAUSE or SUSPEND"},
		{"idle action out of range without idleSeconds", func(s *torporv1.TemplateSpec) { s.IdlePolicy = &torporv1.IdlePolicy{Action: 99} }, "spec.idlePolicy.action", "want PAUSE or SUSPEND"},
		{"negative eviction minimum", func(s *torporv1.TemplateSpec) {
			s.IdlePolicy = &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: -1}}
		}, "spec.idlePolicy.eviction.minIdleSeconds", "must not be negative"},
		{"freeze before the idle action", func(s *torporv1.TemplateSpec) {
			s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 60, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE, FreezeSeconds: 5}
		}, "", ""},
		{"freeze without an idle action", func(s *torporv1.TemplateSpec) { s.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: 5} }, "", ""},
		{"negative freeze", func(s *torporv1.TemplateSpec) { s.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: -1} }, "spec.idlePolicy.freezeSeconds", "must not be negative"},
		{"freeze after the idle action", func(s *torporv1.TemplateSpec) {
			s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 60, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND, FreezeSeconds: 60}
		}, "spec.idlePolicy.freezeSeconds", "60 must be less than idleSeconds (60)"},
		{"warm workers", func(s *torporv1.TemplateSpec) { s.WarmWorkers = 3 }, "", ""},
		{"negative warm workers", func(s *torporv1.TemplateSpec) { s.WarmWorkers = -1 }, "spec.warmWorkers", "-1: want 0 to 256"},
		{"too many warm workers", func(s *torporv1.TemplateSpec) { s.WarmWorkers = 10000 }, "spec.warmWorkers", "10000: want 0 to 256"},
		{"volume kind out of range", func(s *torporv1.TemplateSpec) { s.Volumes[0].Kind = 99 }, "spec.volumes[0].kind", "want DURABLE"},
		{"env bomb", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = manyEnv(25_000, 150) }, "spec.containers[0].env", "25000 variables, more than 256"},
		{"env bytes", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = manyEnv(100, 400) }, "spec.containers[0].env", "more than 32768"},
		{"env name with =", func(s *torporv1.TemplateSpec) { s.Containers[0].Env[0].Name = "A=B" }, "spec.containers[0].env[0].name", "no '='"},
		{"env name with NUL", func(s *torporv1.TemplateSpec) { s.Containers[0].Env[0].Name = "A\x00" }, "spec.containers[0].env[0].name", "no NUL"},
		{"env value with NUL", func(s *torporv1.TemplateSpec) { s.Containers[0].Env[0].Value = "a\x00b" }, "spec.containers[0].env[0].value", "NUL"},
		{"long env name", func(s *torporv1.TemplateSpec) { s.Containers[0].Env[0].Name = strings.Repeat("A", 257) }, "spec.containers[0].env[0].name", "longer than 256"},
		{"arg with NUL", func(s *torporv1.TemplateSpec) { s.Containers[0].Args = []string{"a\x00"} }, "spec.containers[0].args[0]", "NUL"},
		{"command and args bytes", func(s *torporv1.TemplateSpec) {
			s.Containers[0].Args = strings.Split(strings.Repeat(strings.Repeat("a", 4000)+" ", 9), " ")
		}, "spec.containers[0].args", "more than 32768"},
		{"mount over the identity", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/run/torpor/identity" }, "spec.containers[0].mounts[0].path", "would hide /run/torpor"},
		{"mount over /run/torpor", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/run/torpor" }, "spec.containers[0].mounts[0].path", "would hide"},
		{"mount above /run/torpor", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/run" }, "spec.containers[0].mounts[0].path", "would hide"},
		{"mount beside /run/torpor", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/run/torpor-data" }, "", ""},
		{"too many mounts", func(s *torporv1.TemplateSpec) {
			for i := range 33 {
				s.Containers[0].Mounts = append(s.Containers[0].Mounts, &torporv1.Mount{Volume: "data", Path: fmt.Sprintf("/m%d", i)})
			}
		}, "spec.containers[0].mounts", "more than 32"},
		{"long mount path", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/" + strings.Repeat("d", 1024) }, "spec.containers[0].mounts[0].path", "longer than 1024"},
		{"relative workingDir", func(s *torporv1.TemplateSpec) { s.Containers[0].WorkingDir = "srv" }, "spec.containers[0].workingDir", "not an absolute path"},
		{"port out of range", func(s *torporv1.TemplateSpec) { s.Containers[0].Port = 70000 }, "spec.containers[0].port", "not a port"},
		{"probe path with a newline", func(s *torporv1.TemplateSpec) {
			s.Containers[0].ReadinessProbe = &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/ready\r\nX-Evil: 1", Port: 8080}}
		}, "spec.containers[0].readinessProbe.httpGet.path", "control character"},
		{"long sandbox class", func(s *torporv1.TemplateSpec) { s.SandboxClass = strings.Repeat("k", 64) }, "spec.sandboxClass", "longer than 63"},
		{"whole spec", func(s *torporv1.TemplateSpec) {
			// Every container within its own limits, together too big.
			for i := range 3 {
				s.Containers = append(s.Containers, &torporv1.Container{Name: fmt.Sprintf("c%d", i), Image: "app@sha256:0", Command: []string{"/app"}, Env: manyEnv(200, 100)})
			}
		}, "spec", "more than 65536"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := goodSpec()
			tc.change(spec)
			err := Template(&torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "app"}, Spec: spec}, nil)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Template = %v, want valid", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path != tc.field || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("Template = %v, want a field error at %s saying %q", err, tc.field, tc.reason)
			}
			// The node checks a workload's spec by the same rules, under
			// its own path.
			err = TemplateSpec("workload.template", spec, nil)
			if !errors.As(err, &fe) || fe.Path != "workload.template"+strings.TrimPrefix(tc.field, "spec") {
				t.Fatalf("TemplateSpec = %v, want a field error at workload.template%s", err, strings.TrimPrefix(tc.field, "spec"))
			}
		})
	}
}

func TestSandboxClass(t *testing.T) {
	tmpl := func(class string) *torporv1.Template {
		return &torporv1.Template{Spec: &torporv1.TemplateSpec{SandboxClass: class}}
	}
	offered := []string{"gvisor", "kata-node-class"}
	for _, class := range []string{"", "gvisor", "kata-node-class"} {
		if err := SandboxClass(tmpl(class), offered); err != nil {
			t.Errorf("SandboxClass(%q) = %v, want offered", class, err)
		}
	}
	var fe *FieldError
	if err := SandboxClass(tmpl("kata"), offered); !errors.As(err, &fe) || fe.Path != "spec.sandboxClass" || !strings.Contains(fe.Reason, "gvisor, kata-node-class") {
		t.Fatalf("SandboxClass(kata) = %v, want refused at spec.sandboxClass naming the offered classes", err)
	}
}

func TestImages(t *testing.T) {
	tmpl := &torporv1.Template{Spec: &torporv1.TemplateSpec{Containers: []*torporv1.Container{{Image: "ok"}, {Image: "refused"}}}}
	err := Images(tmpl, func(ref string) error {
		if ref == "refused" {
			return errors.New("registry x is not allowed")
		}
		return nil
	})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "spec.containers[1].image" || !strings.Contains(fe.Reason, "registry x is not allowed") {
		t.Fatalf("Images = %v, want refused at spec.containers[1].image with the policy's rule", err)
	}
}
