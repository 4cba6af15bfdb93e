package cli

import (
	"strings"
	"testing"
)

// FuzzParseTemplates: whatever the file, the loader answers without
// panicking, in bounded memory (aliases and size are budgeted), with an
// error that names the file or with templates that local validation can
// check. The seed corpus is in testdata/fuzz/FuzzParseTemplates.
func FuzzParseTemplates(f *testing.F) {
	f.Add([]byte(goodTemplate))
	f.Add([]byte(minimal + "---\n" + minimal))
	f.Add([]byte(minimal + "    env: &e [{name: A, value: b}]\n  - {name: side, image: oci:./image, env: *e}\n"))
	f.Add([]byte(aliasBomb(20)))
	f.Fuzz(func(t *testing.T, data []byte) {
		manifests, err := parseTemplates("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(manifests) == 0 {
			t.Fatal("no templates and no error")
		}
		for _, m := range manifests {
			if m.template == nil {
				t.Fatal("a manifest without its template")
			}
			// Images are not pinned (that reads the disk): validation
			// names them, or other fields, and must not panic either.
			if err := m.validate(); err != nil && !strings.HasPrefix(err.Error(), "f.yaml:") {
				t.Fatalf("validation error %q does not name the file and line", err)
			}
		}
	})
}
