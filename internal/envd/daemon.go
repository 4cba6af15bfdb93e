package envd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// Command is the torpor subcommand that runs the daemon.
const Command = "envd"

// serveArg makes the launcher's child serve.
const serveArg = "serve"

// initArg makes the process the supervisor of a container's process.
const initArg = "init"

// awaitFlag makes the launcher wait for the supervisor's daemon first.
const awaitFlag = "--await"

// configFD is where the serving child reads its Config: a pipe from the
// launcher, so the access token is in no file, argument or environment
// a process of the sandbox could read.
const configFD = 3

// maxConfig bounds the Config the launcher reads.
const maxConfig = 1 << 20

// startTimeout is how long the launcher waits for the daemon to answer.
const startTimeout = 10 * time.Second

// Main runs `torpor envd`, in one of three ways.
//
// `torpor envd [--await]`, which the node execs in a running sandbox,
// reads a Config (JSON) from stdin and makes sure the daemon serves on
// Port. When one answers already (a restored sandbox brought its own
// back, or the supervisor serves) it does nothing; with --await it first
// waits a while for the supervisor's. Else it starts one detached, in its
// own session with its standard streams on /dev/null (none of the exec's
// host descriptors may stay open in the sandbox, or it could not be
// checkpointed), and waits until it answers. `torpor envd serve` is that
// daemon. It and what it starts came from an exec, which runsc kills when
// it restores the sandbox: the next launch starts a new daemon.
//
// `torpor envd init --config FILE -- ARGV...` is the supervisor: the
// container's process of an E2B sandbox that the node cold-boots. It runs
// ARGV (the container's own process) as its child with its own streams,
// passes it the signals it gets and exits as it does, and serves the API
// from its own process with the Config in FILE: what it starts descends
// from the container's process and survives suspends and restores.
func Main(args []string, stdin io.Reader, stderr io.Writer) int {
	var err error
	switch {
	case len(args) == 1 && args[0] == serveArg:
		err = serveFromPipe()
	case len(args) >= 1 && args[0] == initArg:
		return supervise(args[1:], stderr)
	case len(args) == 0:
		err = launch(stdin, 0)
	case len(args) == 1 && args[0] == awaitFlag:
		err = launch(stdin, startTimeout)
	default:
		fmt.Fprintf(stderr, "usage: torpor %s [%s] < config.json | %s %s --config FILE -- ARGV...\n", Command, awaitFlag, Command, initArg)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "envd:", err)
		return 1
	}
	return 0
}

// launch makes sure a daemon serves, starting one after await when none
// answers by then.
func launch(stdin io.Reader, await time.Duration) error {
	cfg, err := io.ReadAll(io.LimitReader(stdin, maxConfig+1))
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	if len(cfg) > maxConfig {
		return fmt.Errorf("config: over %d bytes", maxConfig)
	}
	if err := json.Unmarshal(cfg, &Config{}); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for deadline := time.Now().Add(await); ; time.Sleep(50 * time.Millisecond) {
		if healthy() {
			return nil
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("its own executable: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("config pipe: %w", err)
	}
	defer r.Close()
	// Stdin, Stdout and Stderr nil: the null device.
	child := exec.Command(self, Command, serveArg)
	child.Dir = "/"
	child.ExtraFiles = []*os.File{r}
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		w.Close()
		return fmt.Errorf("start the daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	_, err = w.Write(cfg)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hand the daemon its config: %w", err)
	}
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			if healthy() {
				return nil // another launch's daemon won the port
			}
			return fmt.Errorf("the daemon exited: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if healthy() {
			return nil
		}
	}
	return fmt.Errorf("the daemon did not answer on port %d within %s", Port, startTimeout)
}

// healthy reports whether a daemon answers on Port.
func healthy() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(Port)+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// serveFromPipe is the daemon: it reads its Config from configFD and
// serves until killed.
func serveFromPipe() error {
	f := os.NewFile(configFD, "config")
	if f == nil {
		return errors.New("no config pipe")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfig))
	f.Close()
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return serve(cfg)
}

// serve serves the API with cfg on Port until the process ends.
func serve(cfg Config) error {
	ln, err := net.Listen("tcp", "0.0.0.0:"+strconv.Itoa(Port))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s := New(cfg, slog.New(slog.DiscardHandler))
	defer s.Close()
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second}
	// HTTP/2 without TLS too, for proxies that speak it (Connect's client
	// streams need it).
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv.Serve(ln)
}
