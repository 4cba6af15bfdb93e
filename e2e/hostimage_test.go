package e2e

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The test images are packed from this machine's own programs (Debian's),
// so no registry or container engine is needed: each program with the
// shared libraries it loads.

var lddLibrary = regexp.MustCompile(`(?m)(/\S+) \(0x`)

// addPrograms adds to files, at each guest path, the host program of that
// name (looked up in PATH, or a path) and every shared library it loads, at the
// library's own path.
func addPrograms(tb testing.TB, files map[string]string, programs map[string]string) {
	tb.Helper()
	for guest, name := range programs {
		host, err := exec.LookPath(name)
		if err != nil {
			tb.Fatalf("program %s for a test image: %v", name, err)
		}
		if host, err = filepath.EvalSymlinks(host); err != nil {
			tb.Fatal(err)
		}
		files[guest] = host
		out, err := exec.Command("ldd", host).Output()
		if err != nil {
			tb.Fatalf("ldd %s: %v", host, err)
		}
		for _, m := range lddLibrary.FindAllStringSubmatch(string(out), -1) {
			files[m[1]] = m[1]
		}
	}
}

// addPythonModules adds Debian's python3 at /usr/bin/python3 with its
// libraries and the standard library modules the statements imports load
// (and those the interpreter loads at start), as the interpreter finds them
// when started isolated (-I -S). It returns the standard library's
// directory.
func addPythonModules(tb testing.TB, files map[string]string, imports string) string {
	tb.Helper()
	// Debian's, whatever else PATH has first (pyenv's shims, say).
	const debianPython = "/usr/bin/python3"
	if _, err := os.Stat(debianPython); err != nil {
		tb.Fatalf("Debian's python3: %v (apt-get install -y python3-minimal)", err)
	}
	addPrograms(tb, files, map[string]string{"/usr/bin/python3": debianPython})
	python := files["/usr/bin/python3"]
	out, err := exec.Command(python, "-I", "-S", "-c",
		imports+"\nimport sys\nprint('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)))").Output()
	if err != nil {
		tb.Fatalf("modules of %s for %q: %v", python, imports, err)
	}
	var stdlib string
	for _, f := range strings.Fields(string(out)) {
		files[f] = f
		if strings.HasSuffix(f, "/os.py") {
			stdlib = filepath.Dir(f)
		}
	}
	if stdlib == "" {
		tb.Fatalf("%s loads no os.py:\n%s", python, out)
	}
	return stdlib
}

// addPythonStdlib adds Debian's python3 with its whole standard library
// (less its tests, tools and build files) and the libraries its extension
// modules load: for images whose programs may import anything, as an E2B
// user's code does.
func addPythonStdlib(tb testing.TB, files map[string]string) {
	tb.Helper()
	stdlib := addPythonModules(tb, files, "import os")
	skip := map[string]bool{"test": true, "idlelib": true, "tkinter": true, "turtledemo": true, "ensurepip": true, "lib2to3": true, "__pycache__": true}
	var extensions []string
	err := filepath.WalkDir(stdlib, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[d.Name()] || strings.HasPrefix(d.Name(), "config-") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			files[path] = path
			if strings.HasSuffix(path, ".so") {
				extensions = append(extensions, path)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("python3's standard library: %v", err)
	}
	for _, so := range extensions {
		out, err := exec.Command("ldd", so).Output()
		if err != nil {
			tb.Fatalf("ldd %s: %v", so, err)
		}
		for _, m := range lddLibrary.FindAllStringSubmatch(string(out), -1) {
			files[m[1]] = m[1]
		}
	}
}
