package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// aliasBomb is a template whose one container, holding n arguments, is
// listed n more times through an alias: n*n values from a file of a few
// kilobytes.
func aliasBomb(n int) string {
	var b strings.Builder
	b.WriteString(minimal)
	b.WriteString("  - &c {name: bomb, image: oci:./image, args: [" + strings.Repeat("x,", n) + "x]}\n")
	for range n {
		b.WriteString("  - *c\n")
	}
	return b.String()
}

// TestAliasBombRefused: a file whose aliases expand far beyond what it
// holds is refused at the alias that takes it past the limit, naming the
// file and line, before anything is built from it.
func TestAliasBombRefused(t *testing.T) {
	const n = 1000
	doc := aliasBomb(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := parseTemplates("bomb.yaml", []byte(doc))
	runtime.ReadMemStats(&after)

	// Each alias adds the container's n+2 nodes (itself, its list, the
	// arguments); the lines after the anchor are one alias each.
	line := strings.Count(minimal, "\n") + 1 + maxAliasedNodes/(n+2) + 1
	want := "bomb.yaml:" + strconv.Itoa(line) + ": alias *c: the file's aliases expand to more than 10000 values"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %v\nwant prefix %s", err, want)
	}
	// Expanded, the file is a million strings: hundreds of megabytes of
	// trees. Parsing the file as written takes well under a megabyte.
	const bound = 16 << 20
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > bound {
		t.Errorf("parsing a %d-byte alias bomb allocated %d bytes, want at most %d", len(doc), allocated, bound)
	}
}

// TestAliasesWithinBudget: sharing fragments through anchors keeps
// working up to the limit, however the aliases nest.
func TestAliasesWithinBudget(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string
	}{
		{
			// 99 arguments and their list: 100 nodes per alias.
			name: "exactly at the limit",
			doc:  minimal + "    args: &a [" + strings.Repeat("x,", 98) + "x]\n" + strings.Repeat("  - {name: c, image: oci:./image, args: *a}\n", maxAliasedNodes/100),
		},
		{
			name:    "one value past it",
			doc:     minimal + "    args: &a [" + strings.Repeat("x,", 98) + "x]\n" + strings.Repeat("  - {name: c, image: oci:./image, args: *a}\n", maxAliasedNodes/100) + "  - &one {name: d, image: oci:./image}\n  - *one\n",
			wantErr: "alias *one: the file's aliases expand to more than",
		},
		{
			// An alias inside an anchored node counts each time the node
			// is followed.
			name:    "nested",
			doc:     minimal + "    env: &e [{name: A, value: b}]\n  - &c {name: c, image: oci:./image, env: *e}\n" + strings.Repeat("  - *c\n", 2000),
			wantErr: "alias *c: the file's aliases expand to more than",
		},
		{
			name:    "an anchor holding an alias to itself",
			doc:     minimal + "    args: &a [x, *a]\n",
			wantErr: "alias *a: the file's aliases expand to more than",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseTemplates("t.yaml", []byte(tt.doc))
			if tt.wantErr == "" {
				if err != nil && strings.Contains(err.Error(), "aliases expand") {
					t.Fatalf("refused within the limit: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestOversizedManifestRefused: a file over 1 MiB is refused naming it,
// whether given whole or read from a file or stdin, and an endless stdin is
// not read to its end.
func TestOversizedManifestRefused(t *testing.T) {
	big := minimal + "    args: [\"" + strings.Repeat("x", maxManifestBytes) + "\"]\n"
	const want = "big.yaml: a template file may hold at most 1048576 bytes (1 MiB)"
	if _, err := parseTemplates("big.yaml", []byte(big)); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %v\nwant prefix %s", err, want)
	}
	file := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(file, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := readManifestFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != maxManifestBytes+1 {
		t.Errorf("read %d bytes of the file, want %d (enough to tell it is too big)", len(data), maxManifestBytes+1)
	}
	data, err = readManifest(endless{})
	if err != nil || len(data) != maxManifestBytes+1 {
		t.Fatalf("endless stdin: read %d bytes (%v), want %d", len(data), err, maxManifestBytes+1)
	}
	// At the limit exactly, the file is read whole and parsed.
	fits := minimal + "    args: [\"" + strings.Repeat("x", maxManifestBytes-len(minimal)-len("    args: [\"\"]\n")) + "\"]\n"
	if len(fits) != maxManifestBytes {
		t.Fatalf("test file is %d bytes, want %d", len(fits), maxManifestBytes)
	}
	if _, err := parseTemplates("fits.yaml", []byte(fits)); err != nil {
		t.Fatalf("a file of exactly 1 MiB: %v", err)
	}
}

// endless is a stdin that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	copy(p, bytes.Repeat([]byte("#"), len(p)))
	return len(p), nil
}
