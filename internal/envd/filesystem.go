package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/torpor-dev/torpor/api/gen/envd/filesystem"
)

// filesystemService serves filesystem.Filesystem on the sandbox's files,
// as the calling user.
type filesystemService struct {
	s *Server
}

// resolve is the absolute path a call names, for the user it names.
func (f *filesystemService) resolve(h http.Header, p string) (identity, string, error) {
	if p == "" {
		return identity{}, "", connect.NewError(connect.CodeInvalidArgument, errors.New("path: required"))
	}
	name, err := basicUser(h)
	if err != nil {
		return identity{}, "", err
	}
	id := f.s.users.lookup(name)
	return id, id.abs(p), nil
}

func (f *filesystemService) Stat(_ context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	_, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	entry, err := statEntry(path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entry}), nil
}

func (f *filesystemService) MakeDir(_ context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	id, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		what := "a directory"
		if !fi.IsDir() {
			what = "not a directory"
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("make directory %s: it exists (%s)", path, what))
	}
	if err := makeDirs(id, path); err != nil {
		return nil, fsError("make directory", path, err)
	}
	entry, err := statEntry(path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entry}), nil
}

func (f *filesystemService) Move(_ context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	id, src, err := f.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetDestination() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("destination: required"))
	}
	dst := id.abs(req.Msg.GetDestination())
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError("move", src, err)
	}
	if err := makeDirs(id, filepath.Dir(dst)); err != nil {
		return nil, fsError("move to", dst, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError("move "+src+" to", dst, err)
	}
	entry, err := statEntry(dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entry}), nil
}

func (f *filesystemService) ListDir(_ context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	_, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fsError("list", path, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("list %s: not a directory", path))
	}
	depth := max(req.Msg.GetDepth(), 1)
	resp := &fspb.ListDirResponse{}
	if err := listDir(path, depth, &resp.Entries); err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// listDir appends dir's entries, and theirs down to depth levels.
func listDir(dir string, depth uint32, out *[]*fspb.EntryInfo) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fsError("list", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while listed
		}
		if err != nil {
			return fsError("list", p, err)
		}
		*out = append(*out, entryInfo(p, fi))
		if fi.IsDir() && depth > 1 {
			if err := listDir(p, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *filesystemService) Remove(_ context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	_, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, fsError("remove", path, err)
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, fsError("remove", path, err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// makeDirs creates dir and its missing parents, owned by the user.
func makeDirs(id identity, dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: %w", dir, syscall.ENOTDIR)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := makeDirs(id, parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return id.own(dir)
}

// statEntry describes path (a symlink itself).
func statEntry(path string) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fsError("stat", path, err)
	}
	return entryInfo(path, fi), nil
}

func entryInfo(path string, fi fs.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name: fi.Name(), Path: path, Size: fi.Size(), Mode: uint32(fi.Mode()),
		Permissions: fi.Mode().String(), ModifiedTime: timestamppb.New(fi.ModTime()),
		Type: fspb.FileType_FILE_TYPE_FILE,
	}
	switch {
	case fi.IsDir():
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
		if target, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &target
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = userName(st.Uid), groupName(st.Gid)
	}
	return e
}

func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}

// fsError is the Connect error of a failed file operation on path.
func fsError(op, path string, err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC):
		code = connect.CodeResourceExhausted
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return connect.NewError(code, fmt.Errorf("%s %s: %w", op, path, err))
}
