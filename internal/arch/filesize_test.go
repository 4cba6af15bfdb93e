package arch

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// maxFileLines bounds every Go file of the repository that is not
// generated: one that grows past it holds more than one concern and is
// split by concern (docs/architecture.md) before the next feature lands
// in it.
const maxFileLines = 700

// generated is the header `go generate` tools write (go.dev/s/generatedcode).
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

func TestNoGoFileOverTheLimit(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "node_modules" || name == "bin" || name[0] == '.') {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if generated.Match(header(data)) {
			return nil
		}
		checked++
		if n := bytes.Count(data, []byte("\n")); n > maxFileLines {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s has %d lines, over %d: split it by concern (docs/architecture.md)", rel, n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked %d Go files under %s: the walk missed the repository", checked, root)
	}
}

// header is the part of a Go file before its package clause, where a
// generated file says so.
func header(data []byte) []byte {
	var end int
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("package ")) {
			break
		}
		end += len(sc.Bytes()) + 1
	}
	return data[:min(end, len(data))]
}
