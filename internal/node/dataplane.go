package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/actorlog"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/guestfs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// dataPlane serves what reaches into a running workload without changing
// its slot: exec (exec.go), its log and its files (through the guest
// helper, guestfiles.go). It looks the slot up and checks whom it hosts,
// but runs outside the slot's operations (ops.go): it records nothing.
type dataPlane struct {
	node     string
	log      *slog.Logger
	rt       runtime.Runtime
	slots    slotLookup
	logs     *actorLogs
	guest    *guestHelper
	identity *workloadIdentity
	// pumps feed a call's stream into a process (exec's input, a
	// write's data). One ends with its stream, which its caller may keep
	// open past the call's end; the agent waits for them once its server
	// has stopped, which ends every stream.
	pumps sync.WaitGroup
}

// slotLookup finds a worker's slot (slotMachine.slot).
type slotLookup interface {
	slot(worker string) (*slot, error)
}

func newDataPlane(m *slotMachine) *dataPlane {
	return &dataPlane{node: m.node, log: m.log, rt: m.rt, slots: m, logs: m.logs, guest: m.guest, identity: m.identity}
}

// logs streams the actor's log on this node: the records asked for (the
// last tail lines of them), then with follow each new one until the actor
// stops here or the caller leaves. Without a worker: the log this node
// keeps of an actor whose workload stopped here.
func (d *dataPlane) actorLogs(ctx context.Context, msg *torporv1.LogsRequest, send func(*torporv1.GetActorLogsResponse) error) error {
	f := actorlog.Filter{Container: msg.GetContainer()}
	if msg.GetSince() != nil {
		f.Since = msg.GetSince().AsTime()
	}
	var recs []*torporv1.LogRecord
	var follow chan *torporv1.LogRecord
	if msg.GetWorker() == "" {
		var err error
		recs, err = d.logs.readKept(msg.GetActorUid(), f)
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.Errorf(errdefs.ErrNotFound, "node %s keeps no log of actor %s", d.node, msg.GetActorUid())
		}
		if err != nil {
			return fmt.Errorf("node %s: log of actor %s: %w", d.node, msg.GetActorUid(), err)
		}
	} else {
		s, err := d.slots.slot(msg.GetWorker())
		if err != nil {
			return err
		}
		if err := hosts(s, s.current(), msg.GetActorUid()); err != nil {
			return err
		}
		recs, follow, err = d.logs.read(msg.GetActorUid(), f, msg.GetFollow())
		if err != nil {
			return fmt.Errorf("worker %s: log of actor %s: %w", s.name(), msg.GetActorUid(), err)
		}
		if follow != nil {
			defer d.logs.unfollow(msg.GetActorUid(), follow)
		}
	}
	recs = actorlog.LastLines(recs, int(msg.GetTail()))
	for batch := range slices.Chunk(recs, logBatch) {
		if err := send(&torporv1.GetActorLogsResponse{Records: batch}); err != nil {
			return err
		}
	}
	if follow == nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r, ok := <-follow:
			if !ok {
				return nil
			}
			if !f.Match(r) {
				continue
			}
			if err := send(&torporv1.GetActorLogsResponse{Records: []*torporv1.LogRecord{r}}); err != nil {
				return err
			}
		}
	}
}

// guestExits are the kinds of the helper's failures, by exit status.
var guestExits = map[int]error{
	guestfs.ExitNotFound:     errdefs.ErrNotFound,
	guestfs.ExitInvalid:      errdefs.ErrInvalidArgument,
	guestfs.ExitTooLarge:     errdefs.ErrResourceExhausted,
	guestfs.ExitPrecondition: errdefs.ErrFailedPrecondition,
	guestfs.ExitDenied:       errdefs.ErrPermissionDenied,
}

// runGuest runs the helper on op and path in the container of the worker
// the request names, which must host the actor it names. Its failure
// keeps its kind (the helper's exit status) and its words.
func (d *dataPlane) runGuest(ctx context.Context, req *torporv1.NodeFileRequest, stdin io.Reader, stdout io.Writer, op string, args ...string) error {
	s, err := d.slots.slot(req.GetWorker())
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
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%w", err)
	}
	helper, err := d.guest.place(s, d.identity.dir(s))
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := append([]string{helper, guestfs.Command, op, req.GetPath()}, args...)
	code, err := d.rt.ExecStream(ctx, s.rt, runtime.ExecSpec{Container: req.GetContainer(), Command: cmd, Stdin: stdin, Stdout: stdout, Stderr: &limitedBuffer{b: &stderr}})
	if err != nil {
		return fmt.Errorf("worker %s: actor %s: %s %s: %w", s.name(), req.GetActorUid(), op, req.GetPath(), err)
	}
	if code == guestfs.ExitOK {
		return nil
	}
	msg := string(bytes.TrimSpace(stderr.Bytes()))
	if kind, ok := guestExits[code]; ok {
		return errdefs.New(kind, msg)
	}
	return fmt.Errorf("the file helper exited %d: %s", code, msg)
}

// statFile describes one path of the worker's workload.
func (d *dataPlane) statFile(ctx context.Context, req *torporv1.NodeFileRequest) (*torporv1.FileInfo, error) {
	var out bytes.Buffer
	if err := d.runGuest(ctx, req, nil, &out, guestfs.OpStat); err != nil {
		return nil, err
	}
	var info guestfs.Info
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		return nil, fmt.Errorf("stat %s: the helper's answer: %w", req.GetPath(), err)
	}
	return fileInfo(info), nil
}

// listFiles lists a directory of the worker's workload.
func (d *dataPlane) listFiles(ctx context.Context, req *torporv1.NodeFileRequest) (*torporv1.ListActorFilesResponse, error) {
	var out bytes.Buffer
	if err := d.runGuest(ctx, req, nil, &out, guestfs.OpList); err != nil {
		return nil, err
	}
	var infos []guestfs.Info
	if err := json.Unmarshal(out.Bytes(), &infos); err != nil {
		return nil, fmt.Errorf("list %s: the helper's answer: %w", req.GetPath(), err)
	}
	resp := &torporv1.ListActorFilesResponse{}
	for _, i := range infos {
		resp.Files = append(resp.Files, fileInfo(i))
	}
	return resp, nil
}

// readFiles streams a file, or an archive of a path, of the worker's
// workload.
func (d *dataPlane) readFiles(ctx context.Context, req *torporv1.NodeReadFilesRequest, send func(*torporv1.FileChunk) error) error {
	op := guestfs.OpRead
	if req.GetArchive() {
		op = guestfs.OpTar
	}
	out := bufio.NewWriterSize(writerFunc(func(b []byte) (int, error) {
		if err := send(&torporv1.FileChunk{Data: b}); err != nil {
			return 0, err
		}
		return len(b), nil
	}), fileChunk)
	if err := d.runGuest(ctx, req.GetFile(), nil, out, op); err != nil {
		return err
	}
	return out.Flush()
}

// fileUpload is the stream of a file's data to write (a
// connect.ClientStream).
type fileUpload interface {
	Receive() bool
	Msg() *torporv1.NodeWriteFilesRequest
	Err() error
}

// writeFiles writes a file, or extracts an archive, into the worker's
// workload from the upload's data.
func (d *dataPlane) writeFiles(ctx context.Context, stream fileUpload) (*torporv1.WriteActorFilesResponse, error) {
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
	var size atomic.Int64
	d.pumps.Go(func() {
		data := first.GetData()
		for {
			if len(data) > 0 {
				size.Add(int64(len(data)))
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
	})
	err := d.runGuest(ctx, first.GetFile(), r, io.Discard, op, args...)
	r.Close()
	if err != nil {
		return nil, err
	}
	return &torporv1.WriteActorFilesResponse{Size: size.Load()}, nil
}
