package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/testkit"
)

// spawner starts the cluster's programs from one OS thread that lives
// until close. The kernel sends Pdeathsig when the thread that forked a
// child exits, not the process, and Go ends threads: a goroutine that
// exits while locked to its thread (as network-namespace code does) takes
// the thread with it. A program forked from a shared thread could thus be
// killed in the middle of a test.
type spawner struct {
	starts chan func()
	done   chan struct{}
}

func newSpawner() *spawner {
	s := &spawner{starts: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		runtime.LockOSThread() // never unlocked: the thread ends with close, after the programs
		for start := range s.starts {
			start()
		}
	}()
	return s
}

// start runs cmd.Start on the spawner's thread.
func (s *spawner) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	s.starts <- func() { errc <- cmd.Start() }
	return <-errc
}

// close ends the spawner's goroutine and its thread.
func (s *spawner) close() {
	close(s.starts)
	<-s.done
}

// process is one program of the test cluster, run in a process group of
// its own so that stopping it reaches anything it started, with its
// output in a log file.
type process struct {
	name    string
	logFile string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the program has exited and cmd.Wait returned
	waitErr error
}

// startProcess runs bin with args, its output into logFile. The program
// is killed if the test process dies first (Pdeathsig), so a crashed or
// timed-out test leaves none behind either.
func (s *spawner) startProcess(name, logFile string, env []string, bin string, args ...string) (*process, error) {
	out, err := os.Create(logFile)
	if err != nil {
		return nil, fmt.Errorf("create the log of %s: %w", name, err)
	}
	defer out.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.start(cmd); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, logFile: logFile, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop kills the program's process group and returns once the program
// has exited. SIGKILL, not a graceful stop: the cluster keeps nothing
// that outlives the test, and the kernel closes every socket and file.
func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// logTail is the end of the program's output, for the error that says it
// did not come up.
func (p *process) logTail() string {
	const max = 4 << 10
	data, err := os.ReadFile(p.logFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(data) > max {
		data = data[len(data)-max:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}

// probeTimeout bounds each request of waitHealthy.
const probeTimeout = 2 * time.Second

// plainHTTP probes the programs' plain-HTTP health endpoints.
var plainHTTP = &http.Client{Timeout: probeTimeout}

// waitHealthy polls url with client until it answers 200, the program
// exits, or ctx ends; the error carries the end of the program's log.
func (p *process) waitHealthy(ctx context.Context, client *http.Client, url string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s answered %s", url, resp.Status)
		}
		last = err
		select {
		case <-p.exited:
			return &exitError{name: p.name, url: url, err: p.waitErr, logFile: p.logFile, log: p.logTail()}
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy at %s (%w: %v); its log (%s) ends:\n%s", p.name, url, ctx.Err(), last, p.logFile, p.logTail())
		case <-tick.C:
		}
	}
}

// exitError says a program exited before it was healthy.
type exitError struct {
	name, url, logFile, log string
	err                     error
}

func (e *exitError) Error() string {
	return fmt.Sprintf("%s exited (%v) before %s answered; its log (%s) ends:\n%s", e.name, e.err, e.url, e.logFile, e.log)
}

// lostPort tells whether the program exited because a port it was given
// was taken between freePorts and its bind.
func (e *exitError) lostPort() bool { return strings.Contains(e.log, "address already in use") }

// freePorts returns n distinct loopback ports free at the time of the
// call, for programs that cannot report the port they bound.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		port, err := testkit.Port()
		if err != nil {
			return nil, err
		}
		ports = append(ports, strconv.Itoa(port))
	}
	return ports, nil
}
