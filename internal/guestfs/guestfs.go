// Package guestfs is the file helper that runs inside an actor's sandbox:
// the node agent runs the torpor binary there (`torpor guest-files OP
// PATH`, with runsc exec) for the API's file calls. It runs where the
// workload's files are: a sandbox keeps its root filesystem's writes in its
// own memory (gVisor's overlay), out of the host's sight, and sees its
// volumes as the workload does, so one path serves both and a file reads
// the same before and after a restore.
//
// Inside the sandbox the root is the actor's own: no name or symlink can
// lead outside it. Paths must still be absolute and free of ".."
// segments (CheckPath), and an archive is extracted confined to its
// target directory (fstree: no entry through a symlink, none climbing
// out). Every operation moves at most MaxBytes.
//
// Protocol: data on standard input and output; on failure a message on
// standard error and an exit status naming its kind (the exit* constants),
// which the node maps back to an error kind.
package guestfs

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/fstree"
)

// Command is the torpor subcommand that runs the helper.
const Command = "guest-files"

// MaxBytes bounds what one file call moves: a file's bytes, or an
// archive's. A larger transfer fails, naming the path.
const MaxBytes = 1 << 30

// Exit statuses of the helper, by kind of failure.
const (
	ExitOK       = 0
	ExitFailed   = 1
	ExitNotFound = 2
	ExitInvalid  = 3
	ExitTooLarge = 4
	// ExitPrecondition: the path exists but is of the wrong kind (a
	// directory read as a file, a file listed as a directory).
	ExitPrecondition = 5
	// ExitDenied: the container's user may not do it (the helper runs as
	// the container's process does).
	ExitDenied = 6
)

// Operations.
const (
	OpStat  = "stat"
	OpList  = "list"
	OpRead  = "read"
	OpTar   = "tar"
	OpWrite = "write" // PATH MODE
	OpUntar = "untar"
)

// Info describes a file, as stat and list print it (JSON).
type Info struct {
	Name       string    `json:"name"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	ModTime    time.Time `json:"modTime"`
	IsDir      bool      `json:"isDir"`
	LinkTarget string    `json:"linkTarget,omitempty"`
}

// CheckPath accepts an absolute path without "." or ".." segments (after
// the leading slash, empty segments from doubled or trailing slashes are
// ignored).
func CheckPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q: want an absolute path in the actor", p)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q: contains a NUL byte", p)
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return fmt.Errorf("path %q: a \"..\" segment would climb out of the path; name the file directly", p)
		}
	}
	return nil
}

// failure is an error with the exit status it ends the helper with.
type failure struct {
	code int
	err  error
}

func (f *failure) Error() string { return f.err.Error() }

func fail(code int, format string, args ...any) error {
	return &failure{code, fmt.Errorf(format, args...)}
}

// Main runs the helper on args (OP PATH [MODE]) and returns its exit
// status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := run(args, stdin, stdout)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, err)
	var f *failure
	if errors.As(err, &f) {
		return f.code
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ExitNotFound
	case errors.Is(err, fs.ErrPermission):
		return ExitDenied
	case errors.Is(err, fstree.ErrThroughSymlink):
		return ExitInvalid
	}
	return ExitFailed
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) < 2 {
		return fail(ExitInvalid, "usage: %s OP PATH", Command)
	}
	op, p := args[0], args[1]
	if err := CheckPath(p); err != nil {
		return &failure{ExitInvalid, err}
	}
	p = path.Clean(p)
	switch op {
	case OpStat:
		info, err := stat(p)
		if err != nil {
			return err
		}
		info.Name = p
		return json.NewEncoder(stdout).Encode(info)
	case OpList:
		return list(p, stdout)
	case OpRead:
		return read(p, stdout)
	case OpTar:
		return writeTar(p, stdout)
	case OpWrite:
		mode := uint64(0o644)
		if len(args) > 2 {
			var err error
			if mode, err = strconv.ParseUint(args[2], 8, 32); err != nil || mode > 0o7777 {
				return fail(ExitInvalid, "mode %q: want octal permission bits", args[2])
			}
		}
		return write(p, fs.FileMode(mode), stdin)
	case OpUntar:
		return untar(p, stdin)
	}
	return fail(ExitInvalid, "unknown operation %q", op)
}

func stat(p string) (Info, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return Info{}, err
	}
	info := Info{Name: fi.Name(), Size: fi.Size(), Mode: uint32(fi.Mode()), ModTime: fi.ModTime(), IsDir: fi.IsDir()}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if info.LinkTarget, err = os.Readlink(p); err != nil {
			return Info{}, err
		}
	}
	return info, nil
}

func list(p string, stdout io.Writer) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fail(ExitPrecondition, "path %s is not a directory", p)
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	infos := make([]Info, 0, len(entries))
	for _, e := range entries {
		info, err := stat(filepath.Join(p, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		infos = append(infos, info)
	}
	return json.NewEncoder(stdout).Encode(infos)
}

func tooLarge(p string) error {
	return fail(ExitTooLarge, "path %s: more than %d bytes (1 GiB), the limit of one file call", p, MaxBytes)
}

func read(p string, stdout io.Writer) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fail(ExitPrecondition, "path %s is not a regular file (read a directory as an archive)", p)
	}
	if fi.Size() > MaxBytes {
		return tooLarge(p)
	}
	n, err := io.Copy(stdout, io.LimitReader(f, MaxBytes+1))
	if err == nil && n > MaxBytes {
		return tooLarge(p)
	}
	return err
}

// limitWriter fails once more than MaxBytes went through it.
type limitWriter struct {
	w    io.Writer
	n    int64
	path string
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if l.n += int64(len(b)); l.n > MaxBytes+64<<10 { // room for tar's headers and padding
		return 0, tooLarge(l.path)
	}
	return l.w.Write(b)
}

// writeTar writes an archive of p (a file, or a directory and everything
// under it), its entries named under p's base name.
func writeTar(p string, stdout io.Writer) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(&limitWriter{w: stdout, path: p})
	base := path.Base(p)
	if fi.IsDir() {
		root, err := fstree.Open(p)
		if err != nil {
			return err
		}
		defer root.Close()
		if err := fstree.WriteTar(tw, root, base); err != nil {
			return err
		}
		return tw.Close()
	}
	if !fi.Mode().IsRegular() {
		return fail(ExitPrecondition, "path %s is neither a regular file nor a directory", p)
	}
	root, err := fstree.Open(path.Dir(p))
	if err != nil {
		return err
	}
	defer root.Close()
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return err
	}
	hdr.Name, hdr.Uname, hdr.Gname, hdr.Format = base, "", "", tar.FormatPAX
	f, err := root.Open(base)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return err
	}
	return tw.Close()
}

// limited reads at most MaxBytes, then fails naming path.
func limited(r io.Reader, p string) io.Reader {
	return &limitReader{r: io.LimitReader(r, MaxBytes+1), path: p}
}

type limitReader struct {
	r    io.Reader
	n    int64
	path string
}

func (l *limitReader) Read(b []byte) (int, error) {
	n, err := l.r.Read(b)
	if l.n += int64(n); l.n > MaxBytes {
		return 0, tooLarge(l.path)
	}
	return n, err
}

// write replaces p's content with stdin's, atomically: a reader of p sees
// the old file or the whole new one.
func write(p string, mode fs.FileMode, stdin io.Reader) error {
	dir, base := path.Split(p)
	if base == "" {
		return fail(ExitInvalid, "path %s names a directory; a file write needs a file name", p)
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return fail(ExitPrecondition, "path %s is a directory", p)
	}
	root, err := fstree.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tmp := fmt.Sprintf(".%s.torpor-%d", base, os.Getpid())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, limited(stdin, p))
	if err == nil {
		err = f.Chmod(mode) // the umask may have taken bits away
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, base)
	}
	if err != nil {
		root.Remove(tmp) //nolint:errcheck // best effort; the error says what failed
		return err
	}
	return nil
}

// untar extracts an archive from stdin into the directory p, made if
// missing.
func untar(p string, stdin io.Reader) error {
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return fail(ExitPrecondition, "path %s is not a directory", p)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	root, err := fstree.Open(p)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := fstree.Extract(context.Background(), root, limited(stdin, p)); err != nil {
		return fmt.Errorf("extract into %s: %w", p, err)
	}
	return nil
}
