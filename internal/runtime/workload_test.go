package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestWorkloadCheck(t *testing.T) {
	rootfs, data, cache, certs := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	good := func() Workload {
		return Workload{
			ActorUID: "uid-1",
			Template: &torporv1.TemplateSpec{
				Containers: []*torporv1.Container{{
					Name: "main", Command: []string{"/app"},
					Mounts: []*torporv1.Mount{
						{Volume: "data", Path: "/data/"},
						{Volume: "cache", Path: "/cache", ReadOnly: true},
					},
				}},
				Volumes: []*torporv1.Volume{{Name: "data"}, {Name: "cache"}},
			},
			Rootfs:      map[string]string{"main": rootfs},
			Volumes:     map[string]string{"data": data, "cache": cache},
			ExtraMounts: map[string]string{"/var/run/identity": certs, "/etc/extra": certs},
		}
	}
	cases := []struct {
		name    string
		change  func(w *Workload)
		wantErr string
	}{
		{"good", func(*Workload) {}, ""},
		{"no template", func(w *Workload) { w.Template = nil }, "no template"},
		{"no containers", func(w *Workload) { w.Template.Containers = nil }, "has 0 containers"},
		{"second container without rootfs", func(w *Workload) {
			w.Template.Containers = append(w.Template.Containers, &torporv1.Container{Name: "side", Command: []string{"/side"}})
		}, `rootfs of containers["side"]`},
		{"duplicate container name", func(w *Workload) {
			w.Template.Containers = append(w.Template.Containers, &torporv1.Container{Name: "main", Command: []string{"/side"}})
		}, `containers[1].name: "main" is used by another container`},
		{"container name not a label", func(w *Workload) { w.Template.Containers[0].Name = "../main" }, "containers[0].name"},
		{"no command", func(w *Workload) { w.Template.Containers[0].Command = nil }, `containers["main"]: nothing to run`},
		{"no command, image ENTRYPOINT", func(w *Workload) {
			w.Template.Containers[0].Command = nil
			w.ImageConfig = map[string]v1.Config{"main": {Entrypoint: []string{"/app"}}}
		}, ""},
		{"image USER unknown", func(w *Workload) {
			w.ImageConfig = map[string]v1.Config{"main": {User: "app"}}
		}, `containers["main"]: image USER: user "app"`},
		{"args only", func(w *Workload) {
			w.Template.Containers[0].Command, w.Template.Containers[0].Args = nil, []string{"/app"}
		}, ""},
		{"relative working dir", func(w *Workload) { w.Template.Containers[0].WorkingDir = "srv" }, "working_dir"},
		{"no rootfs", func(w *Workload) { w.Rootfs = nil }, `rootfs of containers["main"]: no host directory`},
		{"missing rootfs", func(w *Workload) { w.Rootfs["main"] = filepath.Join(rootfs, "x") }, "no such file"},
		{"undeclared volume", func(w *Workload) { w.Template.Volumes = w.Template.Volumes[:1] }, `mounts[1] (volume "cache"): the template declares no such volume`},
		{"volume without dir", func(w *Workload) { delete(w.Volumes, "data") }, `mounts[0] (volume "data"): the workload has no host directory`},
		{"relative volume dir", func(w *Workload) { w.Volumes["data"] = "data" }, "not absolute"},
		{"relative guest path", func(w *Workload) { w.Template.Containers[0].Mounts[0].Path = "data" }, `guest path "data" is not absolute`},
		{"guest path used twice", func(w *Workload) { w.ExtraMounts["/data"] = certs }, "already used by"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := good()
			tc.change(&w)
			cs, err := w.Check()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Check() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) != 1 || cs[0].Rootfs != rootfs || cs[0].Container.GetName() != "main" {
				t.Fatalf("Check() = %+v", cs)
			}
		})
	}

	// CheckShape takes host directories that do not exist yet, never
	// relative ones or a missing rootfs.
	future := good()
	future.Volumes["data"] = filepath.Join(data, "later")
	if _, err := future.CheckShape(); err != nil {
		t.Fatalf("CheckShape with a volume directory made later: %v", err)
	}
	if _, err := future.Check(); err == nil {
		t.Fatal("Check with a missing volume directory succeeded")
	}
	future.Volumes["data"] = "later"
	if _, err := future.CheckShape(); err == nil || !strings.Contains(err.Error(), "not absolute") {
		t.Fatalf("CheckShape with a relative volume directory = %v", err)
	}
	future = good()
	future.Rootfs["main"] = filepath.Join(rootfs, "x")
	if _, err := future.CheckShape(); err == nil {
		t.Fatal("CheckShape with a missing rootfs succeeded")
	}

	cs, err := good().Check()
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0]
	want := []BindMount{
		{Host: data, Guest: "/data"},
		{Host: cache, Guest: "/cache", ReadOnly: true},
		{Host: certs, Guest: "/etc/extra", ReadOnly: true},
		{Host: certs, Guest: "/var/run/identity", ReadOnly: true},
	}
	if !slices.Equal(c.Mounts, want) {
		t.Fatalf("mounts = %+v, want volume mounts in template order, then extra mounts by guest path, read-only: %+v", c.Mounts, want)
	}
}

// The process a workload runs is its container's settings over its
// image's configuration, with the image's USER resolved in its rootfs.
func TestWorkloadCheckMergesImageConfig(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte("app:x:1000:1000::/home/app:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := Workload{
		ActorUID: "uid-1",
		Template: &torporv1.TemplateSpec{Containers: []*torporv1.Container{{
			Name: "main", Args: []string{"--port=9000"},
			Env: []*torporv1.EnvVar{{Name: "MODE", Value: "template"}},
		}}},
		Rootfs: map[string]string{"main": rootfs},
		ImageConfig: map[string]v1.Config{"main": {
			Entrypoint: []string{"/app"}, Cmd: []string{"--port=80"},
			Env: []string{"PATH=/bin", "MODE=image"}, WorkingDir: "/srv", User: "app",
		}},
	}
	cs, err := w.Check()
	if err != nil {
		t.Fatal(err)
	}
	p := cs[0].Process
	if !slices.Equal(p.Args, []string{"/app", "--port=9000"}) || !slices.Equal(p.Env, []string{"PATH=/bin", "MODE=template"}) ||
		p.Cwd != "/srv" || p.UID != 1000 || p.GID != 1000 {
		t.Fatalf("Check().Process = %+v, want /app --port=9000, env PATH=/bin MODE=template, cwd /srv, user 1000:1000", p)
	}
}

// Containers of one workload share its volumes and extra mounts, each at
// its own guest paths, with a root filesystem of its own.
func TestWorkloadCheckSeveralContainers(t *testing.T) {
	mainRootfs, sideRootfs, data, certs := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	w := Workload{
		ActorUID: "uid-1",
		Template: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{
				{Name: "main", Command: []string{"/app"}, Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}}},
				{Name: "side", Command: []string{"/side"}, Mounts: []*torporv1.Mount{{Volume: "data", Path: "/srv/shared", ReadOnly: true}}},
			},
			Volumes: []*torporv1.Volume{{Name: "data"}},
		},
		Rootfs:      map[string]string{"main": mainRootfs, "side": sideRootfs},
		Volumes:     map[string]string{"data": data},
		ExtraMounts: map[string]string{"/var/run/identity": certs},
	}
	cs, err := w.Check()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Container.GetName() != "main" || cs[1].Container.GetName() != "side" {
		t.Fatalf("Check() = %+v, want main then side", cs)
	}
	if cs[0].Rootfs != mainRootfs || cs[1].Rootfs != sideRootfs {
		t.Fatalf("rootfs = %s, %s; want each container's own", cs[0].Rootfs, cs[1].Rootfs)
	}
	if !slices.Equal(cs[1].Process.Args, []string{"/side"}) {
		t.Fatalf("side runs %q, want its own command", cs[1].Process.Args)
	}
	// Init runs the first container's process under it, and only that one.
	w.Init = []string{"/sup", "--"}
	if cs, err = w.Check(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cs[0].Process.Args, []string{"/sup", "--", "/app"}) || !slices.Equal(cs[1].Process.Args, []string{"/side"}) {
		t.Fatalf("with Init: main runs %q, side %q; want /sup -- /app and /side", cs[0].Process.Args, cs[1].Process.Args)
	}
	want := []BindMount{{Host: data, Guest: "/srv/shared", ReadOnly: true}, {Host: certs, Guest: "/var/run/identity", ReadOnly: true}}
	if !slices.Equal(cs[1].Mounts, want) {
		t.Fatalf("side's mounts = %+v, want %+v", cs[1].Mounts, want)
	}
}
