package cli

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
)

// imageDir makes a directory holding a real OCI image layout at ./image
// (tag "latest") and returns it with the reference apply pins it to.
func imageDir(t *testing.T) (dir, pinned string) {
	t.Helper()
	dir = t.TempDir()
	payload := filepath.Join(dir, "payload")
	if err := os.WriteFile(payload, []byte("hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(dir, "image")
	digest, err := image.BuildLayout(context.Background(), layout, image.LayoutSpec{
		Files: map[string]string{"/hello": payload},
		Tag:   "latest",
	})
	if err != nil {
		t.Fatalf("build image layout: %v", err)
	}
	return dir, "oci:" + layout + "@" + digest.String()
}

const goodTemplate = `apiVersion: torpor.dev/v1
kind: Template
metadata:
  name: counter
  labels: {app: counter}
spec:
  containers:
  - name: counter
    image: oci:./image:latest
    command: [/hello]
    args: ["--port", "8080"]
    env:
    - {name: GREETING, value: hello}
    readinessProbe:
      httpGet: {path: /healthz, port: 8080}
    mounts:
    - {volume: data, path: /data}
  volumes:
  - {name: data, kind: DURABLE}
  sandboxClass: gvisor
  resources: {memoryMb: 256, cpuMillis: 500}
  snapshotPolicy:
    onPause: FULL
    onCommit: DATA
    onResume: {fromData: GOLDEN}
    keep: 3
  idlePolicy: {idleSeconds: 30, action: SUSPEND}
`

func goodTemplateProto(pinned string) *torporv1.Template {
	return &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Name: "counter", Space: "default", Labels: map[string]string{"app": "counter"}},
		Spec: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{{
				Name:           "counter",
				Image:          pinned,
				Command:        []string{"/hello"},
				Args:           []string{"--port", "8080"},
				Env:            []*torporv1.EnvVar{{Name: "GREETING", Value: "hello"}},
				ReadinessProbe: &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/healthz", Port: 8080}},
				Mounts:         []*torporv1.Mount{{Volume: "data", Path: "/data"}},
			}},
			Volumes:      []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
			SandboxClass: "gvisor",
			Resources:    &torporv1.Resources{MemoryMb: 256, CpuMillis: 500},
			SnapshotPolicy: &torporv1.SnapshotPolicy{
				OnPause:  torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
				OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA,
				OnResume: &torporv1.OnResume{FromData: torporv1.FromData_FROM_DATA_GOLDEN},
				Keep:     3,
			},
			IdlePolicy: &torporv1.IdlePolicy{IdleSeconds: 30, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND},
		},
	}
}

// minimal is the smallest valid document; cases append to or edit it.
const minimal = `apiVersion: torpor.dev/v1
kind: Template
metadata: {name: small}
spec:
  containers:
  - name: main
    image: oci:./image
`

// marked replaces the "#<" marker in a case's YAML by nothing and returns
// the 1-based line it was on, so expected errors need no line counting.
func marked(t *testing.T, doc string) (string, int) {
	t.Helper()
	for i, line := range strings.Split(doc, "\n") {
		if strings.Contains(line, "#<") {
			return strings.Replace(doc, "#<", "", 1), i + 1
		}
	}
	return doc, 0
}

func TestLoadTemplates(t *testing.T) {
	dir, pinned := imageDir(t)
	tests := []struct {
		name    string
		doc     string
		space   string
		chosen  bool   // --space given explicitly
		wantErr string // "{line}" stands for the line of the #< marker
		want    []*torporv1.Template
	}{
		{
			name: "good file",
			doc:  goodTemplate,
			want: []*torporv1.Template{goodTemplateProto(pinned)},
		},
		{
			name: "full and lower-case enum names and proto field names",
			doc: strings.NewReplacer(
				"kind: DURABLE", "kind: volume_kind_durable",
				"onPause: FULL", "on_pause: SNAPSHOT_SCOPE_FULL",
				"onCommit: DATA", "onCommit: data",
				"fromData: GOLDEN", "from_data: Golden",
				"action: SUSPEND", "action: IDLE_ACTION_SUSPEND",
				"memoryMb", "memory_mb",
			).Replace(goodTemplate),
			want: []*torporv1.Template{goodTemplateProto(pinned)},
		},
		{
			name: "enum names as Kubernetes writes them",
			doc:  minimal + "  restartPolicy: OnFailure\n",
			want: []*torporv1.Template{{Metadata: &torporv1.ObjectMeta{Name: "small", Space: "default"}, Spec: &torporv1.TemplateSpec{
				Containers: []*torporv1.Container{{Name: "main", Image: pinned}}, RestartPolicy: torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE,
			}}},
		},
		{
			name: "an egress allowlist",
			doc:  minimal + "  egress:\n    mode: ALLOWLIST\n    rules: [{host: api.example.com, ports: [\"443\"]}, {cidr: 203.0.113.0/24, protocol: UDP}]\n",
			want: []*torporv1.Template{{Metadata: &torporv1.ObjectMeta{Name: "small", Space: "default"}, Spec: &torporv1.TemplateSpec{
				Containers: []*torporv1.Container{{Name: "main", Image: pinned}},
				Egress: &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: []*torporv1.EgressRule{
					{Host: "api.example.com", Ports: []string{"443"}}, {Cidr: "203.0.113.0/24", Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP},
				}},
			}}},
		},
		{
			name: "multiple documents, empty ones skipped",
			doc:  "---\n" + minimal + "---\n" + strings.Replace(minimal, "name: small", "name: other", 1) + "---\n",
			want: []*torporv1.Template{
				{Metadata: &torporv1.ObjectMeta{Name: "small", Space: "default"}, Spec: &torporv1.TemplateSpec{Containers: []*torporv1.Container{{Name: "main", Image: pinned}}}},
				{Metadata: &torporv1.ObjectMeta{Name: "other", Space: "default"}, Spec: &torporv1.TemplateSpec{Containers: []*torporv1.Container{{Name: "main", Image: pinned}}}},
			},
		},
		{
			name:  "space from the file when --space was not given",
			doc:   strings.Replace(minimal, "{name: small}", "{name: small, space: team}", 1),
			space: "default",
			want:  []*torporv1.Template{{Metadata: &torporv1.ObjectMeta{Name: "small", Space: "team"}, Spec: &torporv1.TemplateSpec{Containers: []*torporv1.Container{{Name: "main", Image: pinned}}}}},
		},
		{
			name:    "space in the file disagrees with --space",
			doc:     strings.Replace(minimal, "metadata: {name: small}", "metadata: {name: small, space: team} #<", 1),
			space:   "other",
			chosen:  true,
			wantErr: `t.yaml:{line}: metadata.space: "team" differs from --space "other"`,
		},
		{
			name:    "unknown field names its line",
			doc:     minimal + "    imag: x #<\n",
			wantErr: "t.yaml:{line}: spec.containers[0].imag: unknown field in Container (known: name, image, command,",
		},
		{
			name:    "unknown top-level field",
			doc:     minimal + "extra: 1 #<\n",
			wantErr: "t.yaml:{line}: extra: unknown field in Template",
		},
		{
			name:    "field given twice",
			doc:     minimal + "    image: oci:./image #<\n",
			wantErr: "t.yaml:{line}: spec.containers[0].image: given twice",
		},
		{
			name:    "bad enum names the valid ones",
			doc:     minimal + "  volumes: [{name: data, kind: PERMANENT}] #<\n",
			wantErr: `t.yaml:{line}: spec.volumes[0].kind: "PERMANENT" is not a valid VolumeKind (want one of DURABLE)`,
		},
		{
			name:    "enum as a number",
			doc:     minimal + "  snapshotPolicy:\n    onPause: 1 #<\n",
			wantErr: "t.yaml:{line}: spec.snapshotPolicy.onPause: want one of FULL, DATA, got the number 1",
		},
		{
			name:    "string for an integer",
			doc:     minimal + "  resources: {memoryMb: lots} #<\n",
			wantErr: `t.yaml:{line}: spec.resources.memoryMb: want an integer, got the string "lots"`,
		},
		{
			name:    "integer out of range",
			doc:     minimal + "  idlePolicy: {idleSeconds: 99999999999} #<\n",
			wantErr: "t.yaml:{line}: spec.idlePolicy.idleSeconds: 99999999999 is not a 32-bit integer",
		},
		{
			name:    "scalar for a list",
			doc:     minimal + "    command: /bin/sh #<\n",
			wantErr: `t.yaml:{line}: spec.containers[0].command: want a list, got the string "/bin/sh"`,
		},
		{
			name:    "number for a string",
			doc:     minimal + "    env: [{name: PORT, value: 8080}] #<\n",
			wantErr: "t.yaml:{line}: spec.containers[0].env[0].value: want a string (quote it), got the number 8080",
		},
		{
			name:    "mapping for a list",
			doc:     strings.Replace(minimal, "  containers:\n  - name: main\n", "  containers: #<\n    name: main\n", 1),
			wantErr: "t.yaml:{line}: spec.containers: want a list, got a mapping",
		},
		{
			name:    "validation error points at the field",
			doc:     minimal + "    mounts: [{volume: data, path: data}] #<\n  volumes: [{name: data, kind: DURABLE}]\n",
			wantErr: `t.yaml:{line}: spec.containers[0].mounts[0].path: "data" must be a clean absolute path`,
		},
		{
			name:    "validation of a JSON-named path",
			doc:     minimal + "  snapshotPolicy:\n    onPause: DATA\n    onCommit: FULL #<\n",
			wantErr: "t.yaml:{line}: spec.snapshotPolicy.onCommit: FULL is wider than onPause DATA",
		},
		{
			name:    "missing field is blamed on its parent",
			doc:     strings.Replace(minimal, "  - name: main\n    image: oci:./image\n", "  - name: main #<\n", 1),
			wantErr: "t.yaml:{line}: spec.containers[0].image: required",
		},
		{
			name:    "invalid label key points at the key",
			doc:     strings.Replace(minimal, "metadata: {name: small}", "metadata:\n  name: small\n  labels:\n    \"not valid!\": x #<", 1),
			wantErr: `t.yaml:{line}: metadata.labels["not valid!"]: key is not a valid label key`,
		},
		{
			name:    "invalid name in the second document",
			doc:     minimal + "---\n" + strings.Replace(minimal, "{name: small}", "{name: Not_A_Label} #<", 1),
			wantErr: `t.yaml:{line}: metadata.name: "Not_A_Label" is not a DNS-1123 label`,
		},
		{
			name:    "unresolvable image names file, line and reference",
			doc:     strings.Replace(minimal, "image: oci:./image", "image: oci:./missing:v1 #<", 1),
			wantErr: `t.yaml:{line}: spec.containers[0].image: image "oci:./missing:v1"`,
		},
		{
			name:    "wrong kind",
			doc:     strings.Replace(minimal, "kind: Template", "kind: Actor #<", 1),
			wantErr: `t.yaml:{line}: kind: "Actor" is not supported (want "Template")`,
		},
		{
			name:    "missing apiVersion",
			doc:     "#<\n" + strings.Replace(minimal, "apiVersion: torpor.dev/v1\n", "", 1),
			wantErr: `t.yaml:2: apiVersion: required ("torpor.dev/v1")`,
		},
		{
			name:    "document is not a mapping",
			doc:     "- a #<\n- b\n",
			wantErr: "t.yaml:{line}: document: want a mapping, got a list",
		},
		{
			name:    "YAML syntax error",
			doc:     minimal + "  volumes: [ #<\n",
			wantErr: "t.yaml:{line}: did not find expected node content",
		},
		{
			name:    "no documents",
			doc:     "# nothing here\n",
			wantErr: "t.yaml: no template documents",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, line := marked(t, tt.doc)
			space := tt.space
			if space == "" {
				space = "default"
			}
			manifests, err := loadTemplates(context.Background(), "t.yaml", []byte(doc), dir, space, tt.chosen)
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "{line}", strconv.Itoa(line))
				if err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Fatalf("error = %v\nwant prefix %s", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(manifests) != len(tt.want) {
				t.Fatalf("got %d templates, want %d", len(manifests), len(tt.want))
			}
			for i, m := range manifests {
				if !proto.Equal(m.template, tt.want[i]) {
					t.Errorf("template %d:\n got %s\nwant %s", i, protojson.Format(m.template), protojson.Format(tt.want[i]))
				}
			}
		})
	}
}

func TestParseTemplatesAliases(t *testing.T) {
	// Anchors let one file share fragments; the loader follows them.
	doc := minimal + "    env: &env [{name: A, value: b}]\n  - name: side\n    image: oci:./image\n    env: *env\n"
	manifests, err := parseTemplates("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	containers := manifests[0].template.GetSpec().GetContainers()
	if len(containers) != 2 || !proto.Equal(containers[0].GetEnv()[0], containers[1].GetEnv()[0]) {
		t.Errorf("alias not followed: %v", containers)
	}
}
