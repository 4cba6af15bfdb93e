// Package gateproc runs a node's slot gate (internal/slotgate) as its own
// process, which outlives the node agent the way its sandboxes do: a
// restart of the agent (kill -9, or SIGTERM for an upgrade) cuts none of
// the routed connections the gate spliced, and refuses no new one for the
// actors the gate knows.
//
// The gate process holds the gate's TCP listener and every spliced
// connection; the agent tells it the slots' occupants over a unix socket in
// the node's state directory (the control protocol, this file). Only the
// agent changes a slot's occupant, so a gate without an agent may go on
// admitting for the occupants it was told: nothing it knows goes stale
// while no agent runs.
//
// Parts: Run is the process (process.go), Serve its control server
// (server.go), Client the agent's side (client.go), which starts, finds,
// stops and replaces the process (spawn.go).
package gateproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// Version is the control protocol's. A gate answering another version is
// replaced by the agent (its connections cut, once).
const Version = 1

// Files in the state directory.
const (
	socketFile = "gate.sock"
	pidFile    = "gate.pid"
	lockFile   = "gate.lock"
	logFile    = "gate.log"
)

// Ops of the control protocol, one JSON request a line, each answered by
// one JSON reply line.
const (
	// opHello names the caller's version; the reply the gate's, its pid,
	// its address and whether it serves.
	opHello = "hello"
	// opOccupy sets a slot's occupant (slotgate.Gate.Occupy); the reply
	// comes once it is applied: connections admitted for the previous
	// occupant are closed.
	opOccupy = "occupy"
	// opServe starts accepting on the gate's listener (a no-op once it
	// does): a new gate waits until the agent told it every occupant, so
	// it never refuses a connection for an actor it has not heard of yet.
	// Connections that arrive before wait in the listener's backlog.
	opServe = "serve"
	// opExit stops the gate: the reply comes first, then it closes its
	// listener and every connection and exits.
	opExit = "exit"
	// opHold thaws a slot and keeps it from freezing (slotgate.Gate.Hold)
	// until opRelease on the same connection, or its end.
	opHold    = "hold"
	opRelease = "release"
	// opWatch makes the connection the gate's channel of freezes and
	// thaws: after the reply, one change a line, the slots frozen now
	// first. A watcher too slow to keep up is cut (and, reconnecting,
	// hears the slots frozen then).
	opWatch = "watch"
)

// maxMessage bounds a request or reply line.
const maxMessage = 4 << 10

type request struct {
	Op      string `json:"op"`
	Version int    `json:"version,omitempty"`
	Worker  string `json:"worker,omitempty"`
	IP      string `json:"ip,omitempty"`
	// Actor is the occupant's uid, "" for none.
	Actor string `json:"actor,omitempty"`
	// FreezeAfterMS and Control are the occupant's slotgate.Freeze.
	FreezeAfterMS int64  `json:"freezeAfterMs,omitempty"`
	Control       string `json:"control,omitempty"`
}

type reply struct {
	Error   string `json:"error,omitempty"`
	Version int    `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Addr    string `json:"addr,omitempty"`
	Serving bool   `json:"serving,omitempty"`
	// Freezes: the gate freezes idle slots and takes opHold, opRelease
	// and opWatch (a gate older than freezing does not say so).
	Freezes bool `json:"freezes,omitempty"`
}

// change is one line on a watch connection (slotgate.Change).
type change struct {
	Worker string    `json:"worker"`
	Actor  string    `json:"actor"`
	Frozen bool      `json:"frozen"`
	Time   time.Time `json:"time"`
}

// SocketPath is the control socket of the gate of stateDir.
func SocketPath(stateDir string) string { return filepath.Join(stateDir, socketFile) }

// writeMessage writes v as one line.
func writeMessage(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readMessage reads one line into v.
func readMessage(r *bufio.Reader, v any) error {
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return fmt.Errorf("control message longer than %d bytes", maxMessage)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("control message %.80q: %w", line, err)
	}
	return nil
}
