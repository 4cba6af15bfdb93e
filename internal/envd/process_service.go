package envd

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
)

// processService serves process.Process over the daemon's process table.
type processService struct {
	s *Server
}

// keepalive is the interval a stream's Keepalive-Ping-Interval header
// asks for (seconds); 0 without one.
func keepalive(h http.Header) time.Duration {
	secs, err := strconv.Atoi(h.Get(keepaliveHeader))
	if err != nil || secs <= 0 {
		return 0
	}
	return time.Duration(secs) * time.Second
}

func (ps *processService) List(_ context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	return connect.NewResponse(&pb.ListResponse{Processes: ps.s.procs.list()}), nil
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	name, err := basicUser(req.Header())
	if err != nil {
		return err
	}
	user := ps.s.users.lookup(name)
	spec := startSpec{
		config: req.Msg.GetProcess(), tag: req.Msg.GetTag(), stdin: req.Msg.GetStdin(), pty: req.Msg.Pty,
		user: user, env: user.environ(ps.s.cfg.Env, req.Msg.GetProcess().GetEnvs()),
	}
	p, sub, err := ps.s.procs.start(spec, ctx.Done())
	if err != nil {
		return err
	}
	ps.s.log.Debug("process started", "pid", p.pid, "cmd", spec.config.GetCmd(), "user", user.name)
	err = p.follow(ctx, sub, keepalive(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
	// The call's deadline is the process's lifetime; a client that only
	// left (cancelled) leaves it running, to Connect to again.
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		select {
		case <-p.done:
		default:
			if kerr := p.signal(syscall.SIGKILL); kerr != nil {
				ps.s.log.Warn("process outlived its deadline", "pid", p.pid, "err", kerr)
			}
		}
	}
	return err
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe(ctx.Done())
	return p.follow(ctx, sub, keepalive(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

func (ps *processService) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if err := p.resize(req.Msg.GetPty().GetSize()); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processService) StreamInput(_ context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("start: the first message must select the process"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal: SIGTERM or SIGKILL is required"))
	}
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.signal(sig); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
