package image

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestMerge(t *testing.T) {
	image := v1.Config{
		Entrypoint: []string{"/entry", "--flag"},
		Cmd:        []string{"serve", "--port=80"},
		Env:        []string{"PATH=/image/bin", "MODE=image", "LANG=C", "MODE=later"},
		WorkingDir: "/srv",
		User:       "app:staff",
	}
	defaultPath := "PATH=" + DefaultPath
	tests := []struct {
		name    string
		image   v1.Config
		o       Overrides
		want    Process
		wantErr error
	}{
		{
			name:  "image alone",
			image: image,
			want: Process{Args: []string{"/entry", "--flag", "serve", "--port=80"},
				Env: []string{"PATH=/image/bin", "MODE=later", "LANG=C"}, Cwd: "/srv", User: "app:staff"},
		},
		{
			name:  "command replaces ENTRYPOINT and drops CMD",
			image: image,
			o:     Overrides{Command: []string{"/other"}},
			want: Process{Args: []string{"/other"},
				Env: []string{"PATH=/image/bin", "MODE=later", "LANG=C"}, Cwd: "/srv", User: "app:staff"},
		},
		{
			name:  "args replace CMD after ENTRYPOINT",
			image: image,
			o:     Overrides{Args: []string{"check"}},
			want: Process{Args: []string{"/entry", "--flag", "check"},
				Env: []string{"PATH=/image/bin", "MODE=later", "LANG=C"}, Cwd: "/srv", User: "app:staff"},
		},
		{
			name:  "command and args replace both",
			image: image,
			o:     Overrides{Command: []string{"/other"}, Args: []string{"a", "b"}},
			want: Process{Args: []string{"/other", "a", "b"},
				Env: []string{"PATH=/image/bin", "MODE=later", "LANG=C"}, Cwd: "/srv", User: "app:staff"},
		},
		{
			name:  "CMD alone runs",
			image: v1.Config{Cmd: []string{"/bin/app", "-v"}},
			want:  Process{Args: []string{"/bin/app", "-v"}, Env: []string{defaultPath}, Cwd: "/"},
		},
		{
			name:  "args alone run when the image has no ENTRYPOINT",
			image: v1.Config{Cmd: []string{"/bin/app"}},
			o:     Overrides{Args: []string{"/bin/other"}},
			want:  Process{Args: []string{"/bin/other"}, Env: []string{defaultPath}, Cwd: "/"},
		},
		{
			name:  "container env wins in place, new names follow",
			image: image,
			o:     Overrides{Env: []EnvVar{{"NEW", "1"}, {"MODE", "template"}, {"PATH", "/t/bin"}}},
			want: Process{Args: []string{"/entry", "--flag", "serve", "--port=80"},
				Env: []string{"PATH=/t/bin", "MODE=template", "LANG=C", "NEW=1"}, Cwd: "/srv", User: "app:staff"},
		},
		{
			name:  "PATH from neither gets the default",
			image: v1.Config{Entrypoint: []string{"/a"}, Env: []string{"A=1", "EMPTY="}},
			o:     Overrides{Env: []EnvVar{{"B", "2"}}},
			want:  Process{Args: []string{"/a"}, Env: []string{"A=1", "EMPTY=", "B=2", defaultPath}, Cwd: "/"},
		},
		{
			name:  "workingDir replaces WORKDIR",
			image: image,
			o:     Overrides{WorkingDir: "/data"},
			want: Process{Args: []string{"/entry", "--flag", "serve", "--port=80"},
				Env: []string{"PATH=/image/bin", "MODE=later", "LANG=C"}, Cwd: "/data", User: "app:staff"},
		},
		{
			name:  "relative WORKDIR is taken from /",
			image: v1.Config{Cmd: []string{"/a"}, WorkingDir: "app"},
			want:  Process{Args: []string{"/a"}, Env: []string{defaultPath}, Cwd: "/app"},
		},
		{
			name:    "nothing to run",
			image:   v1.Config{Env: []string{"A=1"}, WorkingDir: "/srv"},
			o:       Overrides{Env: []EnvVar{{"B", "2"}}},
			wantErr: ErrNoCommand,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Merge(tc.image, tc.o)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Merge error = %v, want %v", err, tc.wantErr)
			}
			if !slices.Equal(got.Args, tc.want.Args) || !slices.Equal(got.Env, tc.want.Env) || got.Cwd != tc.want.Cwd || got.User != tc.want.User {
				t.Fatalf("Merge =\n  %+v\nwant\n  %+v", got, tc.want)
			}
		})
	}
}

// Merge must not write into the image's slices: the config is shared by
// every workload of the image.
func TestMergeLeavesConfigAlone(t *testing.T) {
	entry := make([]string, 1, 4)
	entry[0] = "/entry"
	cfg := v1.Config{Entrypoint: entry, Cmd: []string{"a"}}
	if _, err := Merge(cfg, Overrides{Args: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	p, err := Merge(cfg, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Args, []string{"/entry", "a"}) {
		t.Fatalf("second Merge = %q, want [/entry a]", p.Args)
	}
}

func TestLookupUser(t *testing.T) {
	rootfs := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(rootfs, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/passwd.real", "root:x:0:0:root:/root:/bin/sh\n# comment\napp:x:1000:1001::/home/app:/bin/sh\nbroken:x:abc:1\n")
	// /etc/passwd is an absolute symlink, read as the guest would: inside
	// the root filesystem, never the host's.
	if err := os.Symlink("/etc/passwd.real", filepath.Join(rootfs, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	write("etc/group", "root:x:0:\nstaff:x:50:app\nwheel:x:10:\n")
	bare := t.TempDir()

	tests := []struct {
		name     string
		rootfs   string
		user     string
		uid, gid uint32
		wantErr  string
	}{
		{name: "unset is root", rootfs: rootfs, user: ""},
		{name: "numeric uid with an entry takes its group", rootfs: rootfs, user: "1000", uid: 1000, gid: 1001},
		{name: "numeric uid without an entry gets group 0", rootfs: rootfs, user: "4242", uid: 4242},
		{name: "numeric uid:gid", rootfs: rootfs, user: "1000:7", uid: 1000, gid: 7},
		{name: "name", rootfs: rootfs, user: "app", uid: 1000, gid: 1001},
		{name: "name:group", rootfs: rootfs, user: "app:staff", uid: 1000, gid: 50},
		{name: "uid:group name", rootfs: rootfs, user: "33:wheel", uid: 33, gid: 10},
		{name: "name:gid", rootfs: rootfs, user: "app:0", uid: 1000},
		{name: "numeric without /etc/passwd", rootfs: bare, user: "65534:65534", uid: 65534, gid: 65534},
		{name: "unknown name", rootfs: rootfs, user: "nobody", wantErr: `no user "nobody"`},
		{name: "unknown group", rootfs: rootfs, user: "app:nogroup", wantErr: `no group "nogroup"`},
		{name: "name without /etc/passwd", rootfs: bare, user: "app", wantErr: `no user "app"`},
		{name: "bad entry", rootfs: rootfs, user: "broken", wantErr: "not a numeric id"},
		{name: "empty group", rootfs: rootfs, user: "app:", wantErr: "want USER"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			uid, gid, err := LookupUser(tc.rootfs, tc.user)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LookupUser(%q) = %d:%d, %v; want an error containing %q", tc.user, uid, gid, err, tc.wantErr)
				}
				return
			}
			if err != nil || uid != tc.uid || gid != tc.gid {
				t.Fatalf("LookupUser(%q) = %d:%d, %v; want %d:%d", tc.user, uid, gid, err, tc.uid, tc.gid)
			}
		})
	}
}
