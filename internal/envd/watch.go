package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	fspb "github.com/torpor-dev/torpor/api/gen/envd/filesystem"
)

// watch reports changes under a directory (inotify), as events named by
// their path relative to it.
type watch struct {
	root         string
	recursive    bool
	includeEntry bool
	w            *fsnotify.Watcher
	events       chan *fspb.FilesystemEvent
	stop         chan struct{}
	stopOnce     sync.Once
	done         chan struct{}
}

// startWatch watches root, and with recursive every directory under it,
// including those made later.
func startWatch(root string, recursive, includeEntry bool) (*watch, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError("watch", root, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("watch %s: not a directory", root))
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", root, err))
	}
	w := &watch{root: root, recursive: recursive, includeEntry: includeEntry, w: fw,
		events: make(chan *fspb.FilesystemEvent, 256), stop: make(chan struct{}), done: make(chan struct{})}
	if err := w.add(root); err != nil {
		fw.Close()
		return nil, fsError("watch", root, err)
	}
	go w.run()
	return w, nil
}

// add watches dir, and with recursive the directories under it.
func (w *watch) add(dir string) error {
	if !w.recursive {
		return w.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // gone or unreadable below the root: not watched
		}
		if d.IsDir() {
			return w.w.Add(p)
		}
		return nil
	})
}

var eventTypes = []struct {
	op fsnotify.Op
	t  fspb.EventType
}{
	{fsnotify.Create, fspb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, fspb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, fspb.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, fspb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, fspb.EventType_EVENT_TYPE_CHMOD},
}

func (w *watch) run() {
	defer close(w.done)
	defer close(w.events)
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if w.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					_ = w.add(ev.Name) // a directory already gone has nothing to watch
				}
			}
			name, err := filepath.Rel(w.root, ev.Name)
			if err != nil {
				name = ev.Name
			}
			for _, et := range eventTypes {
				if !ev.Has(et.op) {
					continue
				}
				out := &fspb.FilesystemEvent{Name: name, Type: et.t}
				if w.includeEntry {
					if fi, err := os.Lstat(ev.Name); err == nil {
						out.Entry = entryInfo(ev.Name, fi)
					}
				}
				select {
				case w.events <- out:
				case <-w.stop:
					return
				}
			}
		case _, ok := <-w.w.Errors:
			if !ok {
				return
			}
		}
	}
}

// close stops the watch and waits for it.
func (w *watch) close() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.w.Close()
	})
	<-w.done
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	_, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := startWatch(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if every := keepalive(req.Header()); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: the watch ended", path))
			}
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return contextError(ctx)
		}
	}
}

// watchers are the watches CreateWatcher made, whose events wait for
// GetWatcherEvents.
type watchers struct {
	mu   sync.Mutex
	byID map[string]*collector
}

// collector gathers a watch's events.
type collector struct {
	w *watch

	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	done   chan struct{}
}

func newWatchers() *watchers { return &watchers{byID: map[string]*collector{}} }

func (ws *watchers) add(w *watch) string {
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	c := &collector{w: w, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ev := range w.events {
			c.mu.Lock()
			c.events = append(c.events, ev)
			c.mu.Unlock()
		}
	}()
	ws.mu.Lock()
	ws.byID[id] = c
	ws.mu.Unlock()
	return id
}

func (ws *watchers) get(id string) (*collector, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if c, ok := ws.byID[id]; ok {
		return c, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
}

func (ws *watchers) remove(id string) error {
	ws.mu.Lock()
	c, ok := ws.byID[id]
	delete(ws.byID, id)
	ws.mu.Unlock()
	if !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	c.stop()
	return nil
}

func (c *collector) stop() {
	c.w.close()
	<-c.done
}

func (ws *watchers) closeAll() {
	ws.mu.Lock()
	all := ws.byID
	ws.byID = map[string]*collector{}
	ws.mu.Unlock()
	for _, c := range all {
		c.stop()
	}
}

func (f *filesystemService) CreateWatcher(_ context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	_, path, err := f.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := startWatch(path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: f.s.watchers.add(w)}), nil
}

func (f *filesystemService) GetWatcherEvents(_ context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	c, err := f.s.watchers.get(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	events := c.events
	c.events = nil
	c.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(_ context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if req.Msg.GetWatcherId() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("watcher_id: required"))
	}
	if err := f.s.watchers.remove(req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
