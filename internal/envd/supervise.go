package envd

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// forwarded are the signals the supervisor passes to the container's
// process.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// supervise runs `torpor envd init --config FILE -- ARGV...` (see Main)
// and returns the exit status to end with: the child's, 128+N when a
// signal N ended it.
func supervise(args []string, stderr io.Writer) int {
	flags := flag.NewFlagSet(Command+" "+initArg, flag.ContinueOnError)
	flags.SetOutput(stderr)
	configFile := flags.String("config", "", "the daemon's Config (JSON)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	argv := flags.Args()
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "envd init: the container's command is required after --")
		return 2
	}
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, stderr
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, forwarded...)
	defer signal.Stop(signals)
	if err := child.Start(); err != nil {
		fmt.Fprintf(stderr, "envd init: start %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	// The API serves for as long as the container's process runs; its
	// failure to start leaves the container running without it (the node
	// then starts one with an exec).
	go func() {
		cfg, err := readConfig(*configFile)
		if err == nil {
			err = serve(cfg)
		}
		fmt.Fprintln(stderr, "envd init: the in-sandbox API does not serve:", err)
	}()
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	for {
		select {
		case sig := <-signals:
			_ = child.Process.Signal(sig) // it may have exited already
		case <-done:
			ws, ok := child.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case ok && ws.Signaled():
				return 128 + int(ws.Signal())
			case ok:
				return ws.ExitStatus()
			}
			return 1
		}
	}
}

// readConfig reads the daemon's Config from path.
func readConfig(path string) (Config, error) {
	var cfg Config
	if path == "" {
		return cfg, errors.New("--config: required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}
