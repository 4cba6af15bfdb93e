package validate

import (
	"context"
	"errors"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestCommands(t *testing.T) {
	images := map[string]*v1.Config{
		"entrypoint": {Entrypoint: []string{"/app"}},
		"cmd":        {Cmd: []string{"/app"}},
		"bare":       {Env: []string{"A=1"}, WorkingDir: "/srv"},
	}
	var read []string
	config := func(_ context.Context, ref string) (*v1.Config, error) {
		read = append(read, ref)
		if cfg, ok := images[ref]; ok {
			return cfg, nil
		}
		return nil, errors.New("no such image")
	}
	tests := []struct {
		name       string
		containers []*torporv1.Container
		wantPath   string
		wantRead   int
	}{
		{name: "image ENTRYPOINT", containers: []*torporv1.Container{{Image: "entrypoint"}}, wantRead: 1},
		{name: "image CMD", containers: []*torporv1.Container{{Image: "cmd"}}, wantRead: 1},
		{name: "own command, image not read", containers: []*torporv1.Container{{Image: "bare", Command: []string{"/x"}}}},
		{name: "own args, image not read", containers: []*torporv1.Container{{Image: "bare", Args: []string{"/x"}}}},
		{name: "nothing to run", containers: []*torporv1.Container{{Image: "bare"}}, wantPath: "spec.containers[0].command", wantRead: 1},
		{name: "second container", containers: []*torporv1.Container{{Image: "cmd"}, {Image: "bare"}}, wantPath: "spec.containers[1].command", wantRead: 2},
		{name: "unreadable image is left to the node", containers: []*torporv1.Container{{Image: "gone"}}, wantRead: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			read = nil
			tmpl := &torporv1.Template{
				Metadata: &torporv1.ObjectMeta{Space: "default", Name: "t"},
				Spec:     &torporv1.TemplateSpec{Containers: tc.containers},
			}
			err := Commands(context.Background(), tmpl, config)
			var fe *FieldError
			switch {
			case tc.wantPath == "" && err != nil:
				t.Fatalf("Commands = %v, want nil", err)
			case tc.wantPath != "" && (!errors.As(err, &fe) || fe.Path != tc.wantPath):
				t.Fatalf("Commands = %v, want a field error at %s", err, tc.wantPath)
			}
			if len(read) != tc.wantRead {
				t.Fatalf("Commands read images %q, want %d read", read, tc.wantRead)
			}
		})
	}
}
