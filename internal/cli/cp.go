package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/fstree"
)

// cpChunk is the size of the messages an upload sends.
const cpChunk = 256 << 10

func newActorCpCommand(a *app) *cobra.Command {
	var container string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between this machine and an actor",
		Long: "Copy a file or a directory tree to or from an actor; the actor's side is written\n" +
			"NAME:/ABSOLUTE/PATH. A suspended actor is resumed first. When DST is an existing\n" +
			"directory the copy goes into it under SRC's name; otherwise it is created as DST.\n" +
			"Paths in the actor are what its workload sees (root filesystem and volumes);\n" +
			"a path with \"..\" is refused, and nothing from an actor is written outside DST.\n" +
			"One copy moves at most 1 GiB.",
		Example: "  torpor actor cp ./dir c1:/data/dir\n  torpor actor cp c1:/data/dir ./back\n  torpor actor cp c1:/etc/hostname -",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcActor, srcPath, srcRemote := actorPath(args[0])
			dstActor, dstPath, dstRemote := actorPath(args[1])
			if srcRemote == dstRemote {
				return errors.New("name the actor's side of the copy as NAME:/PATH on exactly one side")
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if dstRemote {
				f := &torporv1.ActorFileRequest{Space: a.space, Name: dstActor, Container: container, Path: dstPath}
				return upload(ctx, c, srcPath, f)
			}
			f := &torporv1.ActorFileRequest{Space: a.space, Name: srcActor, Container: container, Path: srcPath}
			if dstPath == "-" {
				return readFile(ctx, c, f, cmd.OutOrStdout())
			}
			return download(ctx, c, f, dstPath)
		},
	}
	cmd.Flags().StringVarP(&container, "container", "c", "", "container of the actor (default: its first)")
	return cmd
}

// actorPath splits NAME:/PATH; a local path (no colon before its first
// slash) is not one.
func actorPath(arg string) (actor, p string, remote bool) {
	name, rest, ok := strings.Cut(arg, ":")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", arg, false
	}
	return name, rest, true
}

// upload copies the local file or directory src to f's path (into it,
// when that is a directory).
func upload(ctx context.Context, c *clients, src string, f *torporv1.ActorFileRequest) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	switch info, err := c.actors.StatActorFile(ctx, connect.NewRequest(f)); {
	case err == nil && info.Msg.GetIsDir():
		f.Path = path.Join(f.GetPath(), filepath.Base(src))
	case err != nil && connect.CodeOf(err) != connect.CodeNotFound:
		return err
	}
	stream := c.actors.WriteActorFiles(ctx)
	first := &torporv1.WriteActorFilesRequest{File: f}
	send := func(b []byte) error {
		msg := first
		if msg == nil {
			msg = &torporv1.WriteActorFilesRequest{}
		}
		first = nil
		msg.Data = b
		return stream.Send(msg)
	}
	var sendErr error
	if fi.IsDir() {
		first.Archive = true
		dir, base := path.Split(f.GetPath())
		f.Path = dir
		pr, pw := io.Pipe()
		go func() {
			pw.CloseWithError(writeLocalTar(pw, src, base))
		}()
		sendErr = sendChunks(pr, send)
		pr.Close()
	} else {
		first.Mode = uint32(fi.Mode().Perm())
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		sendErr = sendChunks(in, send)
	}
	// A refusal of the actor's side ends the stream early (io.EOF on
	// send): the answer says why.
	if _, err := stream.CloseAndReceive(); err != nil {
		return err
	}
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return sendErr
	}
	return nil
}

// sendChunks sends r's bytes in chunks; an empty r still sends one (the
// first message names the file).
func sendChunks(r io.Reader, send func([]byte) error) error {
	buf := make([]byte, cpChunk)
	sent := false
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 || !sent {
			if serr := send(append([]byte(nil), buf[:n]...)); serr != nil {
				return serr
			}
			sent = true
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// writeLocalTar archives the local directory dir with its entries under
// prefix.
func writeLocalTar(w io.Writer, dir, prefix string) error {
	root, err := fstree.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	if err := fstree.WriteTar(tw, root, prefix); err != nil {
		return err
	}
	return tw.Close()
}

// readFile writes the bytes of f's regular file to w.
func readFile(ctx context.Context, c *clients, f *torporv1.ActorFileRequest, w io.Writer) error {
	stream, err := c.actors.ReadActorFiles(ctx, connect.NewRequest(&torporv1.ReadActorFilesRequest{File: f}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return err
		}
	}
	return stream.Err()
}

// download copies f's path (a file or a directory tree) to the local dst
// (into it, when it is a directory). The archive is extracted confined to
// the directory it goes into: no entry climbs out or goes through a
// symlink.
func download(ctx context.Context, c *clients, f *torporv1.ActorFileRequest, dst string) error {
	stream, err := c.actors.ReadActorFiles(ctx, connect.NewRequest(&torporv1.ReadActorFilesRequest{File: f, Archive: true}))
	if err != nil {
		return err
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	go func() {
		for stream.Receive() {
			if _, err := pw.Write(stream.Msg().GetData()); err != nil {
				return
			}
		}
		pw.CloseWithError(stream.Err())
	}()
	from, into, as := path.Base(path.Clean(f.GetPath())), filepath.Dir(dst), filepath.Base(dst)
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		into, as = dst, from
	}
	root, err := fstree.Open(into)
	if err != nil {
		pr.CloseWithError(err)
		return err
	}
	defer root.Close()
	archive := io.Reader(pr)
	if as != from {
		archive = renameTop(pr, from, as)
	}
	if err := fstree.Extract(ctx, root, archive); err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("copy %s:%s to %s: %w", f.GetName(), f.GetPath(), dst, err)
	}
	return nil
}

// renameTop rewrites an archive's entries named from or from/... to
// as and as/...; any other entry is an error.
func renameTop(r io.Reader, from, as string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tr, tw := tar.NewReader(r), tar.NewWriter(pw)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				pw.CloseWithError(tw.Close())
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			name := strings.TrimSuffix(hdr.Name, "/")
			switch {
			case name == from:
				hdr.Name = as
			case strings.HasPrefix(name, from+"/"):
				hdr.Name = as + name[len(from):]
			default:
				pw.CloseWithError(fmt.Errorf("archive entry %q is not under %q", hdr.Name, from))
				return
			}
			if err := tw.WriteHeader(hdr); err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := io.Copy(tw, tr); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr
}
