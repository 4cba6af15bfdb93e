package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// A sandbox's control server: runsc's own commands call it over the unix
// socket r.socket(sandbox id), one JSON object each way per call (gVisor's
// urpc: {"method": M, "arg": A}, answered {"success": B, "err": E,
// "result": R}). Calling it directly costs a connection, where a runsc
// command costs a process: one `runsc wait` per running container held
// about 3 MB of the host's memory for as long as the container ran
// (BenchmarkIdleMemory). The format is runsc's, pinned with it (the
// Makefile's GVISOR_VERSION); the exit tests (e2e.TestWorkloadExits,
// e2e.TestSeveralContainers, node.TestKilledAgentAdoptsItsWorkloads) run
// it against that runsc.

// controlCall calls method of sandbox sandboxID's control server with
// arg and decodes its result into result. It ends with ctx.
func (r *Runtime) controlCall(ctx context.Context, sandboxID, method string, arg, result any) error {
	return callControl(ctx, r.socket(sandboxID), sandboxID, method, arg, result)
}

// callControl calls method of the control server on socket, sandbox
// sandboxID's.
func callControl(ctx context.Context, socket, sandboxID, method string, arg, result any) error {
	conn, err := dialControl(ctx, socket)
	if err != nil {
		return fmt.Errorf("sandbox %s: control socket: %w", sandboxID, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := json.NewEncoder(conn).Encode(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, arg}); err != nil {
		return fmt.Errorf("sandbox %s: %s: %w", sandboxID, method, errors.Join(err, context.Cause(ctx)))
	}
	var reply struct {
		Success bool            `json:"success"`
		Err     string          `json:"err"`
		Result  json.RawMessage `json:"result"`
	}
	if err := json.NewDecoder(conn).Decode(&reply); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("sandbox %s: %s: %w", sandboxID, method, err)
	}
	if !reply.Success {
		return fmt.Errorf("sandbox %s: %s: %s", sandboxID, method, reply.Err)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(reply.Result, result); err != nil {
		return fmt.Errorf("sandbox %s: %s: result %q: %w", sandboxID, method, reply.Result, err)
	}
	return nil
}

// dialControl connects to the unix socket at path, through /proc/self/fd
// when the path is too long for a socket address (108 bytes), as runsc
// does.
func dialControl(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return d.DialContext(ctx, "unix", path)
	}
	f, err := os.OpenFile(path, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(int(f.Fd())))
}

// Pauser pauses and resumes the sandbox whose control socket it names
// (containerManager.Pause and Resume: a call costs well under a
// millisecond, where `runsc pause` costs a process, ~50 ms). Pauses nest
// in the sandbox and a resume with none pending ends it: its one user is
// the slot gate, which keeps each slot's state (slotgate/freeze.go).
type Pauser string

// ControlSocket is the control socket of the sandbox running slot's
// workload: what a Pauser is made of.
func (r *Runtime) ControlSocket(slot runtime.Slot) (string, error) {
	unlock := r.lock(slot.Name)
	active, _, err := r.sandboxes(slot.Name)
	unlock()
	if err != nil {
		return "", err
	}
	if len(active) != 1 {
		return "", fmt.Errorf("slot %s: %w (%d sandboxes)", slot.Name, runtime.ErrNotRunning, len(active))
	}
	return r.socket(active[0]), nil
}

func (p Pauser) Pause(ctx context.Context) error {
	return callControl(ctx, string(p), p.id(), "containerManager.Pause", struct{}{}, nil)
}

func (p Pauser) Resume(ctx context.Context) error {
	return callControl(ctx, string(p), p.id(), "containerManager.Resume", struct{}{}, nil)
}

// id is the sandbox's id, from its socket's name (runsc-ID.sock).
func (p Pauser) id() string {
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(string(p)), "runsc-"), ".sock")
}

// PauseSandbox pauses the sandbox whose control socket is control.
func (r *Runtime) PauseSandbox(ctx context.Context, control string) error {
	return Pauser(control).Pause(ctx)
}

// ResumeSandbox resumes the sandbox whose control socket is control.
func (r *Runtime) ResumeSandbox(ctx context.Context, control string) error {
	return Pauser(control).Resume(ctx)
}
