package envd

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/torpor-dev/torpor/api/gen/envd/filesystem"
	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
)

func TestFilesystem(t *testing.T) {
	d := startDaemon(t, Config{})
	dir := t.TempDir()
	ctx := t.Context()
	made, err := d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/a/b"}))
	if err != nil {
		t.Fatal(err)
	}
	if e := made.Msg.GetEntry(); e.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || e.GetPath() != dir+"/a/b" || e.GetName() != "b" {
		t.Fatalf("made %v", e)
	}
	_, err = d.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/a/b"}))
	wantCode(t, err, connect.CodeAlreadyExists)
	if err := os.WriteFile(dir+"/a/f.txt", []byte("12345"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f.txt", dir+"/a/link"); err != nil {
		t.Fatal(err)
	}
	st, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a/f.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.GetEntry(); e.GetType() != fspb.FileType_FILE_TYPE_FILE || e.GetSize() != 5 || e.GetPermissions() != "-rw-r-----" || e.GetOwner() == "" || e.GetModifiedTime() == nil {
		t.Fatalf("stat %v", e)
	}
	link, err := d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a/link"}))
	if err != nil {
		t.Fatal(err)
	}
	if e := link.Msg.GetEntry(); e.GetType() != fspb.FileType_FILE_TYPE_SYMLINK || e.GetSymlinkTarget() != "f.txt" {
		t.Fatalf("stat of a symlink %v", e)
	}
	_, err = d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/nothing"}))
	wantCode(t, err, connect.CodeNotFound)

	for _, tc := range []struct {
		depth uint32
		want  []string
	}{
		{1, []string{"a"}},
		{2, []string{"a", "a/b", "a/f.txt", "a/link"}},
	} {
		list, err := d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: tc.depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range list.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, e.GetPath())
			got = append(got, rel)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Fatalf("depth %d: %v, want %v", tc.depth, got, tc.want)
		}
	}
	_, err = d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/a/f.txt"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = d.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/nothing"}))
	wantCode(t, err, connect.CodeNotFound)

	moved, err := d.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a/f.txt", Destination: dir + "/c/g.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if moved.Msg.GetEntry().GetPath() != dir+"/c/g.txt" {
		t.Fatalf("moved %v", moved.Msg.GetEntry())
	}
	if b, err := os.ReadFile(dir + "/c/g.txt"); err != nil || string(b) != "12345" {
		t.Fatalf("moved file: %q, %v", b, err)
	}
	_, err = d.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a/f.txt", Destination: dir + "/x"}))
	wantCode(t, err, connect.CodeNotFound)

	if _, err := d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir + "/a"); !os.IsNotExist(err) {
		t.Fatalf("removed directory: %v", err)
	}
	_, err = d.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/a"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = d.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestRelativePathsStartAtHome(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	d := startDaemon(t, Config{})
	if _, err := d.fs.MakeDir(t.Context(), connect.NewRequest(&fspb.MakeDirRequest{Path: "rel/dir"})); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(home + "/rel/dir"); err != nil || !fi.IsDir() {
		t.Fatalf("rel/dir not made in the home directory: %v", err)
	}
	r := startAndWait(t, d, &pb.StartRequest{Process: shell("pwd")})
	if r.stdout != home+"\n" {
		t.Fatalf("default working directory %q, want the home directory %s", r.stdout, home)
	}
}

func TestWatchDir(t *testing.T) {
	d := startDaemon(t, Config{})
	dir := t.TempDir()
	if err := os.Mkdir(dir+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	stream, err := d.fs.WatchDir(t.Context(), connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first event %v (err %v): want start", stream.Msg(), stream.Err())
	}
	if err := os.WriteFile(dir+"/sub/new.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		ev := stream.Msg().GetFilesystem()
		if ev.GetName() == "sub/new.txt" && ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE {
			break
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}

	created, err := d.fs.CreateWatcher(t.Context(), connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetWatcherId()
	if err := os.Remove(dir + "/sub/new.txt"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/top.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for !slices.Contains(seen, "top.txt") {
		got, err := d.fs.GetWatcherEvents(t.Context(), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range got.Msg.GetEvents() {
			seen = append(seen, ev.GetName())
		}
		select {
		case <-t.Context().Done():
			t.Fatal("no event for top.txt")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if slices.Contains(seen, "sub/new.txt") {
		t.Fatalf("events %v: a watcher without recursive saw inside sub", seen)
	}
	if _, err := d.fs.RemoveWatcher(t.Context(), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = d.fs.GetWatcherEvents(t.Context(), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = d.fs.CreateWatcher(t.Context(), connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir + "/nothing"}))
	wantCode(t, err, connect.CodeNotFound)
}
