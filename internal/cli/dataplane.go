package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// exitCode ends the command with a status of its own and no message: the
// status of a process run in an actor.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newActorExecCommand(a *app) *cobra.Command {
	var container string
	var stdin, tty bool
	cmd := &cobra.Command{
		Use:   "exec NAME [-c CONTAINER] [-i] [-t] -- COMMAND [ARG...]",
		Short: "Run a command in an actor (resuming it first); its exit status is this command's",
		Long: "Run COMMAND in a container of the actor (default: its first), as the container's\n" +
			"own process runs: its user, environment and working directory. A suspended actor\n" +
			"is resumed first, and stays running at least while the command runs. -i passes\n" +
			"this command's input to it; -t runs it on a terminal (with -i and a terminal\n" +
			"here: raw mode, and resizes follow this terminal's).",
		Example: "  torpor actor exec c1 -- cat /data/requests.log\n  torpor actor exec c1 -it -- sh",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return errors.New("give the command after --: torpor actor exec NAME -- COMMAND [ARG...]")
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			code, err := execIn(cmd.Context(), c, &torporv1.ExecActorRequest{
				Space: a.space, Name: args[0],
				Process: &torporv1.ExecProcess{Container: container, Command: args[1:], Tty: tty, Stdin: stdin},
			}, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&container, "container", "c", "", "container to run in (default: the template's first)")
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "pass this command's input to the process")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the process on a terminal")
	return cmd
}

// execIn runs the process start names and relays its streams; it returns
// the process's exit status.
func execIn(ctx context.Context, c *clients, start *torporv1.ExecActorRequest, in io.Reader, stdout, stderr io.Writer) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.actors.ExecActor(ctx)
	var sendMu sync.Mutex
	send := func(req *torporv1.ExecActorRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(req)
	}
	p := start.GetProcess()
	local, isTerminal := in.(*os.File)
	isTerminal = isTerminal && term.IsTerminal(int(local.Fd()))
	if p.GetTty() && isTerminal {
		if w, h, err := term.GetSize(int(local.Fd())); err == nil {
			p.Size = &torporv1.TerminalSize{Rows: uint32(h), Cols: uint32(w)}
		}
		if p.GetStdin() {
			old, err := term.MakeRaw(int(local.Fd()))
			if err != nil {
				return 0, fmt.Errorf("terminal: %w", err)
			}
			defer term.Restore(int(local.Fd()), old)
		}
		stop := followResizes(local, func(size *torporv1.TerminalSize) {
			send(&torporv1.ExecActorRequest{Input: &torporv1.ExecInput{Resize: size}})
		})
		defer stop()
	}
	if err := send(start); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	if p.GetStdin() {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if send(&torporv1.ExecActorRequest{Input: &torporv1.ExecInput{Stdin: bytes.Clone(buf[:n])}}) != nil {
						return
					}
				}
				if err != nil {
					send(&torporv1.ExecActorRequest{Input: &torporv1.ExecInput{CloseStdin: true}})
					return
				}
			}
		}()
	}
	for {
		out, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = stream.CloseResponse()
			}
			if err == nil {
				err = errors.New("the stream ended without the process's exit status")
			}
			return 0, err
		}
		if _, err := stdout.Write(out.GetStdout()); err != nil {
			return 0, err
		}
		if _, err := stderr.Write(out.GetStderr()); err != nil {
			return 0, err
		}
		if exit := out.GetExit(); exit != nil {
			sendMu.Lock()
			stream.CloseRequest()
			sendMu.Unlock()
			return int(exit.GetCode()), nil
		}
	}
}

// followResizes calls resized with the terminal's size whenever it
// changes, until stop.
func followResizes(tty *os.File, resized func(*torporv1.TerminalSize)) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if w, h, err := term.GetSize(int(tty.Fd())); err == nil {
					resized(&torporv1.TerminalSize{Rows: uint32(h), Cols: uint32(w)})
				}
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
	}
}

func newActorLogsCommand(a *app) *cobra.Command {
	var container, since string
	var follow bool
	var tail int32
	cmd := &cobra.Command{
		Use:   "logs NAME [-c CONTAINER] [-f] [--since D] [--tail N]",
		Short: "Show the output of an actor's containers, across suspends, resumes and moves",
		Long: "Show what the actor's containers wrote to standard output and error, each line\n" +
			"with its time and container, and torpor's own lines (\"--\") where the actor was\n" +
			"suspended, paused, resumed or stopped. The log is kept with the actor, bounded\n" +
			"(see docs/operations.md). It only reads: a suspended or crashed actor stays as it\n" +
			"is (its log comes from its node or its latest snapshot, a crash's last output\n" +
			"included), and asking is no activity. -f follows new output across suspends,\n" +
			"resumes and moves until the actor is deleted or the command is interrupted;\n" +
			"--tail counts lines; -o json prints records, one a line, their text as text.",
		Example: "  torpor actor logs c1 --tail 20 -f\n  torpor actor logs c1 --since 10m -c counter",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &torporv1.GetActorLogsRequest{Space: a.space, Name: args[0], Container: container, Follow: follow, Tail: tail}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				req.Since = timestamppb.New(t)
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			stream, err := c.actors.GetActorLogs(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			defer stream.Close()
			p := &logPrinter{w: cmd.OutOrStdout(), json: a.output != formatTable, open: map[string]bool{}}
			for stream.Receive() {
				for _, r := range stream.Msg().GetRecords() {
					if err := p.print(r); err != nil {
						return err
					}
				}
			}
			if err := stream.Err(); err != nil && !(follow && errors.Is(cmd.Context().Err(), context.Canceled)) {
				return err
			}
			return p.end()
		},
	}
	cmd.Flags().StringVarP(&container, "container", "c", "", "only this container's output")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "go on with new output")
	cmd.Flags().StringVar(&since, "since", "", "only output since this long ago (10m, 2h) or this time (RFC 3339)")
	cmd.Flags().Int32Var(&tail, "tail", 0, "only the last N lines (0: all)")
	return cmd
}

// parseSince reads --since: a duration back from now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: a duration back from now must be positive", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration (10m) or an RFC 3339 time", s)
	}
	return t, nil
}

// logPrinter prints log records as lines "TIME CONTAINER TEXT", joining
// a line's partial records, or as JSON records, one a line.
type logPrinter struct {
	w    io.Writer
	json bool
	// open: the line of this container and stream goes on.
	open map[string]bool
	// mid: the last thing printed was part of a line.
	mid bool
}

// jsonLogRecord is a log record as -o json prints it: the text as text
// (a line's bytes are text, invalid UTF-8 replaced), not base64 as
// protojson prints bytes.
type jsonLogRecord struct {
	Time      string `json:"time"`
	Container string `json:"container,omitempty"`
	Stream    string `json:"stream"`
	Text      string `json:"text"`
	Partial   bool   `json:"partial,omitempty"`
}

func (p *logPrinter) print(r *torporv1.LogRecord) error {
	if p.json {
		b, err := json.Marshal(jsonLogRecord{
			Time: r.GetTime().AsTime().UTC().Format(time.RFC3339Nano), Container: r.GetContainer(),
			Stream: r.GetStream(), Text: string(r.GetText()), Partial: r.GetPartial(),
		})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	key := r.GetContainer() + "/" + r.GetStream()
	var line strings.Builder
	if !p.open[key] {
		if p.mid {
			line.WriteString("\n")
		}
		who := r.GetContainer()
		if r.GetStream() == "torpor" {
			who = "--"
		}
		fmt.Fprintf(&line, "%s %s ", logTimestamp(r.GetTime().AsTime()), who)
	}
	line.Write(r.GetText())
	p.open[key], p.mid = r.GetPartial(), r.GetPartial()
	if !r.GetPartial() {
		line.WriteString("\n")
	}
	_, err := io.WriteString(p.w, line.String())
	return err
}

func (p *logPrinter) end() error {
	if p.mid {
		_, err := io.WriteString(p.w, "\n")
		return err
	}
	return nil
}

func newActorStatsCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "stats NAME",
		Example: "  torpor actor stats c1\n  torpor actor stats c1 -o json",
		Short:   "Show an actor's CPU and memory use (while it runs) and its snapshots' sizes",
		Long: "Show the CPU time and memory of the actor's sandbox while it runs, and the size of\n" +
			"its latest snapshot and of all its snapshots. It only reads: a suspended actor\n" +
			"stays suspended, and asking is no activity.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			st, err := call(cmd.Context(), c.actors.GetActorStats, &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			if a.output != formatTable {
				return printMessages(cmd.OutOrStdout(), a.output, []proto.Message{st}, false)
			}
			cpu, mem, up := "-", "-", "-"
			if st.GetStarted() != nil {
				cpu = (time.Duration(st.GetCpuSeconds() * float64(time.Second))).Round(time.Millisecond).String()
				mem = byteSize(st.GetMemoryBytes())
				up = time.Since(st.GetStarted().AsTime()).Round(time.Second).String()
			}
			return printTable(cmd.OutOrStdout(), []string{"STATE", "WORKER", "UP", "CPU", "MEMORY", "SNAPSHOTS", "LATEST", "ALL"}, [][]string{{
				enumName(st.GetState()), st.GetWorker(), up, cpu, mem,
				fmt.Sprint(st.GetSnapshots()), byteSize(st.GetLatestSnapshotBytes()), byteSize(st.GetSnapshotsBytes()),
			}})
		},
	}
}

// byteSize is n bytes in binary units.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
