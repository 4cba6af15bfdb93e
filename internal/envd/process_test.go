package envd

import (
	"context"
	"encoding/base64"
	"os/user"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
)

// run is what a started process's stream gave.
type run struct {
	pid            uint32
	stdout, stderr string
	pty            string
	end            *pb.ProcessEvent_EndEvent
}

// collect reads a Start or Connect stream to its end.
func collect(t *testing.T, receive func() bool, msg func() *pb.ProcessEvent, streamErr func() error) run {
	t.Helper()
	var r run
	first := true
	for receive() {
		ev := msg()
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("first event %v: want start", ev)
			}
			r.pid, first = ev.GetStart().GetPid(), false
			continue
		}
		switch {
		case ev.GetData() != nil:
			r.stdout += string(ev.GetData().GetStdout())
			r.stderr += string(ev.GetData().GetStderr())
			r.pty += string(ev.GetData().GetPty())
		case ev.GetEnd() != nil:
			r.end = ev.GetEnd()
		}
	}
	if err := streamErr(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if r.end == nil {
		t.Fatal("stream ended without an end event")
	}
	return r
}

func startAndWait(t *testing.T, d *daemon, req *pb.StartRequest) run {
	t.Helper()
	stream, err := d.process.Start(t.Context(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, stream.Receive, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, stream.Err)
}

// shell runs script as the SDK runs commands, but without -l: a login
// shell reads the host's profile, slow and beside the point here.
func shell(script string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}
}

func TestStartExitCodes(t *testing.T) {
	d := startDaemon(t, Config{})
	for _, tc := range []struct {
		script         string
		code           int32
		stdout, stderr string
	}{
		{"echo hello; echo oops >&2", 0, "hello\n", "oops\n"},
		{"exit 3", 3, "", ""},
		{"no-such-command-here 2>/dev/null", 127, "", ""},
	} {
		t.Run(tc.script, func(t *testing.T) {
			r := startAndWait(t, d, &pb.StartRequest{Process: shell(tc.script)})
			if r.pid == 0 || r.end.GetExitCode() != tc.code || !r.end.GetExited() || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Fatalf("got pid %d, end %v, stdout %q, stderr %q; want code %d, stdout %q, stderr %q", r.pid, r.end, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestStartEnvAndCwd(t *testing.T) {
	d := startDaemon(t, Config{Env: map[string]string{"FROM_SANDBOX": "s", "BOTH": "sandbox"}})
	dir := t.TempDir()
	cfg := shell(`echo "$FROM_SANDBOX $FROM_CALL $BOTH $(pwd)"`)
	cfg.Envs = map[string]string{"FROM_CALL": "c", "BOTH": "call"}
	cfg.Cwd = &dir
	r := startAndWait(t, d, &pb.StartRequest{Process: cfg})
	if want := "s c call " + dir + "\n"; r.stdout != want {
		t.Fatalf("stdout %q, want %q", r.stdout, want)
	}
	missing := dir + "/missing"
	cfg.Cwd = &missing
	stream, err := d.process.Start(t.Context(), connect.NewRequest(&pb.StartRequest{Process: cfg}))
	if err == nil {
		stream.Receive()
		err = stream.Err()
	}
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestStdinAndCloseStdin(t *testing.T) {
	d := startDaemon(t, Config{})
	stdin := true
	stream, err := d.process.Start(t.Context(), connect.NewRequest(&pb.StartRequest{Process: shell("cat; echo done"), Stdin: &stdin}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := d.process.SendInput(t.Context(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("abc\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.process.CloseStdin(t.Context(), connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out string
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if out != "abc\ndone\n" || end.GetExitCode() != 0 {
		t.Fatalf("stdout %q, end %v", out, end)
	}
}

func TestBackgroundListConnectKill(t *testing.T) {
	d := startDaemon(t, Config{})
	ctx, leave := context.WithCancel(t.Context())
	tag := "sleeper"
	stream, err := d.process.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell("echo up; sleep 60"), Tag: &tag}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	leave() // the client goes away: the process stays
	list, err := d.process.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != pid || list.Msg.GetProcesses()[0].GetTag() != tag {
		t.Fatalf("list %v: want pid %d tagged %s", list.Msg.GetProcesses(), pid, tag)
	}
	conn, err := d.process.Connect(t.Context(), connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: first event %v, err %v", conn.Msg(), conn.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := d.process.SendSignal(t.Context(), connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for conn.Receive() {
		if e := conn.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.GetExited() || end.GetExitCode() != -1 || !strings.Contains(end.GetStatus(), "killed") || !strings.Contains(end.GetError(), "killed") {
		t.Fatalf("end %v (err %v): want killed by a signal", end, conn.Err())
	}
	_, err = d.process.SendSignal(t.Context(), connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
	again, err := d.process.Connect(t.Context(), connect.NewRequest(&pb.ConnectRequest{Process: sel}))
	if err == nil {
		again.Receive()
		err = again.Err()
	}
	wantCode(t, err, connect.CodeNotFound)
}

func TestStartDeadlineKills(t *testing.T) {
	d := startDaemon(t, Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	stream, err := d.process.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell("sleep 60")}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
	}
	wantCode(t, stream.Err(), connect.CodeDeadlineExceeded)
	for {
		list, err := d.process.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Msg.GetProcesses()) == 0 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("the process outlived its deadline")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestPTY(t *testing.T) {
	d := startDaemon(t, Config{})
	stream, err := d.process.Start(t.Context(), connect.NewRequest(&pb.StartRequest{
		Process: shell(`stty size; read line; stty size; echo "got $line"`),
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream.Msg().GetEvent().GetStart().GetPid()}}
	var out string
	for !strings.Contains(out, "24 80") && stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetPty())
	}
	if _, err := d.process.Update(t.Context(), connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := d.process.SendInput(t.Context(), connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("hi\n")}}})); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out += string(ev.GetData().GetPty())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if end.GetExitCode() != 0 || !strings.Contains(out, "30 100") || !strings.Contains(out, "got hi") {
		t.Fatalf("terminal output %q, end %v (err %v)", out, end, stream.Err())
	}
}

func TestProcessErrors(t *testing.T) {
	d := startDaemon(t, Config{})
	missing := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}
	for name, call := range map[string]func() error{
		"send input": func() error {
			_, err := d.process.SendInput(t.Context(), connect.NewRequest(&pb.SendInputRequest{Process: missing, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{}}}))
			return err
		},
		"close stdin": func() error {
			_, err := d.process.CloseStdin(t.Context(), connect.NewRequest(&pb.CloseStdinRequest{Process: missing}))
			return err
		},
		"signal": func() error {
			_, err := d.process.SendSignal(t.Context(), connect.NewRequest(&pb.SendSignalRequest{Process: missing, Signal: pb.Signal_SIGNAL_SIGTERM}))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, call(), connect.CodeNotFound) })
	}
	stream, err := d.process.Start(t.Context(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/binary"}}))
	if err == nil {
		stream.Receive()
		err = stream.Err()
	}
	wantCode(t, err, connect.CodeNotFound)
}

func TestNamedUser(t *testing.T) {
	d := startDaemon(t, Config{})
	self := newUsers().self
	nobody, byDefault := "nobody", self.name
	if _, err := user.Lookup(DefaultUser); err == nil {
		byDefault = DefaultUser
	}
	if self.uid != 0 {
		nobody, byDefault = self.name, self.name // only root becomes another user
	}
	for _, tc := range []struct {
		name, want string
	}{
		{"nobody", nobody},
		{"no-such-user-here", self.name},
		{"", byDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := connect.NewRequest(&pb.StartRequest{Process: shell("id -un")})
			if tc.name != "" {
				req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(tc.name+":")))
			}
			stream, err := d.process.Start(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			r := collect(t, stream.Receive, func() *pb.ProcessEvent { return stream.Msg().GetEvent() }, stream.Err)
			if r.stdout != tc.want+"\n" {
				t.Fatalf("ran as %q, want %q", r.stdout, tc.want)
			}
		})
	}
}
