package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
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
	conn, err := dialControl(ctx, r.socket(sandboxID))
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
