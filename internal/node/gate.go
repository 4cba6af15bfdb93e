package node

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/torpor-dev/torpor/internal/atomicfile"
)

// gateFile keeps the address the slot gate listened on, so a restarted
// agent listens there again: running actors' placements name it
// (WorkerRef.gate), and routers keep dialling it until the actor moves.
const gateFile = "gate.addr"

// listenGate opens the slot gate's listener: on cfg.GateListen when set,
// else where the previous run of the agent listened, else on the API's
// host with a port the system picks. It returns the address workers
// advertise (an unspecified host advertised as 127.0.0.1).
func listenGate(cfg Config, apiAddr net.Addr) (net.Listener, string, error) {
	file := filepath.Join(cfg.StateDir, gateFile)
	addr := cfg.GateListen
	if addr == "" {
		prev, err := os.ReadFile(file)
		switch {
		case err == nil:
			addr = strings.TrimSpace(string(prev))
		case !errors.Is(err, fs.ErrNotExist):
			return nil, "", fmt.Errorf("slot gate: %w", err)
		default:
			host, _, err := net.SplitHostPort(apiAddr.String())
			if err != nil {
				return nil, "", fmt.Errorf("slot gate: API address %s: %w", apiAddr, err)
			}
			addr = net.JoinHostPort(host, "0")
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("slot gate: listen on %s: %w", addr, err)
	}
	if err := atomicfile.Write(file, []byte(ln.Addr().String()), 0o600); err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("slot gate: %w", err)
	}
	return ln, strings.TrimPrefix(advertised(ln.Addr()), "https://"), nil
}
