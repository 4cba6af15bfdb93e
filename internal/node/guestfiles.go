package node

// Files of a running workload. A sandbox keeps its root filesystem's writes
// in its own memory, out of the host's sight, so the node reaches files
// from inside: it runs its own binary there (`torpor guest-files`, see
// internal/guestfs) with the runtime's exec, as the container's process
// runs, and relays its standard streams. The binary enters the sandbox
// through the identity directory every sandbox mounts already (a hard link
// named guestHelperName), so no sandbox needs a mount of its own for it and
// images checkpointed before it existed still restore.

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/guestfs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// guestHelperName is the helper's name in a workload's identity
// directory.
const guestHelperName = ".torpor-guest"

// fileChunk is the size of the chunks a read streams.
const fileChunk = 256 << 10

// guestHelper is the node's copy of the helper binary, beside the
// identity directories (so it can be hard-linked into them).
type guestHelper struct {
	// source is the binary to copy: a statically linked torpor (default
	// the node's own executable).
	source string
	// dir is where the copy goes: the identity directories' root.
	dir string

	once sync.Once
	path string
	err  error
}

// install copies the helper into place once; it fails for a binary that
// cannot run in a sandbox (linked dynamically: the image has no loader
// or libraries of the host's).
func (g *guestHelper) install() (string, error) {
	g.once.Do(func() {
		src := g.source
		if src == "" {
			if src, g.err = os.Executable(); g.err != nil {
				g.err = fmt.Errorf("the node's executable: %w", g.err)
				return
			}
		}
		if g.err = checkStatic(src); g.err != nil {
			return
		}
		if g.err = os.MkdirAll(g.dir, 0o755); g.err != nil {
			return
		}
		g.path = filepath.Join(g.dir, guestHelperName)
		tmp := g.path + ".tmp"
		if g.err = copyFile(src, tmp, 0o755); g.err != nil {
			return
		}
		if g.err = os.Rename(tmp, g.path); g.err != nil {
			os.Remove(tmp)
		}
	})
	return g.path, g.err
}

// checkStatic refuses a binary that needs a program interpreter (the
// dynamic loader).
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("guest helper %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "guest helper %s is linked dynamically and cannot run in a sandbox: build torpor with CGO_ENABLED=0 (make build) or point the node at such a binary (node.Config.GuestHelper)", path)
		}
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// placeGuestHelper links the helper into s's identity directory, which
// every start empties, and returns its path in the guest.
func (m *slotMachine) placeGuestHelper(s *slot) (string, error) {
	src, err := m.guest.install()
	if err != nil {
		return "", err
	}
	dst := filepath.Join(m.identity.dir(s), guestHelperName)
	if _, err := os.Lstat(dst); err == nil {
		return IdentityMountPath + "/" + guestHelperName, nil
	}
	if err := os.Link(src, dst); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("worker %s: place the guest helper: %w", s.name(), err)
	}
	return IdentityMountPath + "/" + guestHelperName, nil
}

// runGuest runs the helper on op and path in the container of the worker
// the request names, which must host the actor it names. Its failure
// keeps its kind (the helper's exit status) and its words.
func (m *slotMachine) runGuest(ctx context.Context, req *torporv1.NodeFileRequest, stdin io.Reader, stdout io.Writer, op string, args ...string) error {
	s, err := m.slot(req.GetWorker())
	if err != nil {
		return err
	}
	if err := hosts(s, s.current(), req.GetActorUid()); err != nil {
		return err
	}
	if req.GetContainer() == "" {
		return invalid("container", "required")
	}
	if err := guestfs.CheckPath(req.GetPath()); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	helper, err := m.placeGuestHelper(s)
	if err != nil {
		return errdefs.ToConnect(err)
	}
	var stderr bytes.Buffer
	cmd := append([]string{helper, guestfs.Command, op, req.GetPath()}, args...)
	code, err := m.rt.ExecStream(ctx, s.rt, runtime.ExecSpec{Container: req.GetContainer(), Command: cmd, Stdin: stdin, Stdout: stdout, Stderr: &limitedBuffer{b: &stderr}})
	if err != nil {
		return errdefs.ToConnect(fmt.Errorf("worker %s: actor %s: %s %s: %w", s.name(), req.GetActorUid(), op, req.GetPath(), err))
	}
	if code == guestfs.ExitOK {
		return nil
	}
	msg := errors.New(string(bytes.TrimSpace(stderr.Bytes())))
	switch code {
	case guestfs.ExitNotFound:
		return connect.NewError(connect.CodeNotFound, msg)
	case guestfs.ExitInvalid:
		return connect.NewError(connect.CodeInvalidArgument, msg)
	case guestfs.ExitTooLarge:
		return connect.NewError(connect.CodeResourceExhausted, msg)
	case guestfs.ExitPrecondition:
		return connect.NewError(connect.CodeFailedPrecondition, msg)
	case guestfs.ExitDenied:
		return connect.NewError(connect.CodePermissionDenied, msg)
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("the file helper exited %d: %w", code, msg))
}

// limitedBuffer keeps the first 4 KiB written to it: the helper's
// message.
type limitedBuffer struct{ b *bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func fileInfo(i guestfs.Info) *torporv1.FileInfo {
	return &torporv1.FileInfo{
		Name: i.Name, Size: i.Size, Mode: i.Mode, ModifyTime: timestamppb.New(i.ModTime), IsDir: i.IsDir, LinkTarget: i.LinkTarget,
	}
}

// StatFile describes one path of the worker's workload.
func (m *slotMachine) StatFile(ctx context.Context, req *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.FileInfo], error) {
	var out bytes.Buffer
	if err := m.runGuest(ctx, req.Msg, nil, &out, guestfs.OpStat); err != nil {
		return nil, err
	}
	var info guestfs.Info
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stat %s: the helper's answer: %w", req.Msg.GetPath(), err))
	}
	return connect.NewResponse(fileInfo(info)), nil
}

// ListFiles lists a directory of the worker's workload.
func (m *slotMachine) ListFiles(ctx context.Context, req *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.ListActorFilesResponse], error) {
	var out bytes.Buffer
	if err := m.runGuest(ctx, req.Msg, nil, &out, guestfs.OpList); err != nil {
		return nil, err
	}
	var infos []guestfs.Info
	if err := json.Unmarshal(out.Bytes(), &infos); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("list %s: the helper's answer: %w", req.Msg.GetPath(), err))
	}
	resp := &torporv1.ListActorFilesResponse{}
	for _, i := range infos {
		resp.Files = append(resp.Files, fileInfo(i))
	}
	return connect.NewResponse(resp), nil
}

// ReadFiles streams a file, or an archive of a path, of the worker's
// workload.
func (m *slotMachine) ReadFiles(ctx context.Context, req *connect.Request[torporv1.NodeReadFilesRequest], stream *connect.ServerStream[torporv1.FileChunk]) error {
	op := guestfs.OpRead
	if req.Msg.GetArchive() {
		op = guestfs.OpTar
	}
	out := bufio.NewWriterSize(writerFunc(func(b []byte) (int, error) {
		if err := stream.Send(&torporv1.FileChunk{Data: b}); err != nil {
			return 0, err
		}
		return len(b), nil
	}), fileChunk)
	if err := m.runGuest(ctx, req.Msg.GetFile(), nil, out, op); err != nil {
		return err
	}
	return out.Flush()
}

// WriteFiles writes a file, or extracts an archive, into the worker's
// workload from the stream's data.
func (m *slotMachine) WriteFiles(ctx context.Context, stream *connect.ClientStream[torporv1.NodeWriteFilesRequest]) (*connect.Response[torporv1.WriteActorFilesResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, invalid("file", "required")
	}
	first := stream.Msg()
	op, args := guestfs.OpWrite, []string{strconv.FormatUint(uint64(first.GetMode()&0o7777), 8)}
	if first.GetMode() == 0 {
		args = nil
	}
	if first.GetArchive() {
		op, args = guestfs.OpUntar, nil
	}
	r, w := io.Pipe()
	var size int64
	go func() {
		data := first.GetData()
		for {
			if len(data) > 0 {
				size += int64(len(data))
				if _, err := w.Write(data); err != nil {
					return // the helper stopped reading: its error says why
				}
			}
			if !stream.Receive() {
				w.CloseWithError(stream.Err())
				return
			}
			data = stream.Msg().GetData()
		}
	}()
	err := m.runGuest(ctx, first.GetFile(), r, io.Discard, op, args...)
	r.Close()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.WriteActorFilesResponse{Size: size}), nil
}
