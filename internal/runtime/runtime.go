// Package runtime defines what a node needs from a sandbox runtime: cold
// boot, checkpoint, restore and terminate of one workload per worker slot
// (one sandbox running all of its template's containers), a command run
// in one of its containers, and warming a free slot ahead of a workload,
// so starting it there skips the sandbox's boot. Implementations: gvisor
// (runsc) for real workloads, fake for unit tests.
package runtime

import (
	"context"
	"io"
	"path/filepath"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Slot is one worker's sandbox place on a node: its network and its state
// directory. A slot hosts at most one workload at a time.
type Slot struct {
	// Worker name, unique on the node; also the sandbox id prefix.
	Name string
	// Network namespace path (e.g. /var/run/netns/torpor-w0) and the IP the
	// workload is reachable at from the host.
	NetNS string
	IP    string
	// PrefixLen of IP's subnet and the Gateway (the node bridge's address).
	// A sandbox runtime may consume the namespace's address when it starts
	// (runsc moves it into its own network stack), so it needs the whole
	// configuration to put it back before the next start.
	PrefixLen int
	Gateway   string
	// Output, when set, is a directory of FIFOs the slot's workload
	// writes to, which its node reads: the i-th container's standard
	// output to <i>.out and error to <i>.err (OutputPath). They belong to
	// the slot, not to a workload: a sandbox made ahead of one (Warm)
	// takes them already.
	Output string
}

// OutputPath is the FIFO of slot output directory dir where the i-th
// container's stream ("out" or "err") goes.
func OutputPath(dir string, i int, stream string) string {
	return filepath.Join(dir, strconv.Itoa(i)+"."+stream)
}

// Workload is what runs in a slot.
type Workload struct {
	ActorUID string
	Space    string
	Actor    string
	Template *torporv1.TemplateSpec
	// Unpacked root filesystem of each container, by container name; shared
	// read-only between workers (writes live in the sandbox's overlay).
	Rootfs map[string]string
	// ImageConfig is each container's image configuration (ENTRYPOINT,
	// CMD, ENV, WORKDIR, USER), by container name; the template's settings
	// apply over it. A container missing here runs on its settings alone.
	ImageConfig map[string]v1.Config
	// Host directory of each durable volume, by volume name; bind-mounted
	// into the sandbox at the template's mount paths.
	Volumes map[string]string
	// Extra files to place in the sandbox (e.g. identity), host path by
	// guest directory.
	ExtraMounts map[string]string
	// Init, when set, is an argument vector the first container's process
	// runs under: it is started as Init followed by the container's own
	// argv (the in-sandbox API's supervisor of E2B sandboxes). What it
	// starts descends from the container's process, unlike what an exec
	// starts, which runsc kills when it restores a sandbox.
	Init []string
}

// ExecSpec is a process to run in a container of a slot's workload, with
// its standard streams.
type ExecSpec struct {
	// Container is the container's name; empty for the first one.
	Container string
	Command   []string
	// TTY runs the process on a terminal of Size: Stdout then receives
	// all its output, and Stderr nothing.
	TTY  bool
	Size TerminalSize
	// Stdin is its input; nil gives it end of file at once. A read of it
	// still blocked when the process ended is the caller's to end.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Resize delivers the terminal's new sizes (TTY only); may be nil.
	Resize <-chan TerminalSize
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct{ Rows, Cols uint16 }

// Stats is a point-in-time view of a slot.
type Stats struct {
	Running     bool
	MemoryBytes int64
	// CPU time the sandbox used since Started.
	CPU     time.Duration
	Started time.Time
	// Warm: the slot holds no workload, only a sandbox made ahead of one
	// by Warm (never Running at the same time).
	Warm bool
}

// Runtime runs workloads in slots. Every method is safe to call again after
// a failure or a crash of the caller (idempotent on the slot's state).
type Runtime interface {
	Class() string
	// Run cold-boots w in slot.
	Run(ctx context.Context, slot Slot, w Workload) error
	// Checkpoint writes the sandbox's memory and root filesystem overlay
	// into imageDir. With leaveRunning false the sandbox is gone afterwards.
	Checkpoint(ctx context.Context, slot Slot, imageDir string, leaveRunning bool) error
	// Restore brings w back in slot from a memory image in imageDir (FULL or
	// a golden image); durable volumes must already be in place.
	Restore(ctx context.Context, slot Slot, w Workload, imageDir string) error
	// Terminate removes the sandbox (running or warm) and everything it
	// made; no error if there is nothing to remove.
	Terminate(ctx context.Context, slot Slot) error
	Stats(ctx context.Context, slot Slot) (Stats, error)
	// Exec runs cmd (an argument vector) in the named container of the
	// slot's running workload, as the container's process runs (its user,
	// env and working directory), and waits for it to exit. An exit status
	// other than 0 is an error carrying cmd's output. ErrNotRunning if no
	// workload runs; an error naming the container if it has none of that
	// name.
	Exec(ctx context.Context, slot Slot, container string, cmd []string) error
	// ExecStream runs p as Exec runs a command, with its standard streams
	// attached, and returns its exit status (128+N for a process killed
	// by signal N). An error means it could not be run or waited for.
	ExecStream(ctx context.Context, slot Slot, p ExecSpec) (int, error)
	// Sandboxes lists slots that have a sandbox, running or warm, so a
	// restarted node can adopt or clean them up.
	Sandboxes(ctx context.Context) ([]string, error)
	// Warm prepares a free slot for w ahead of time, off the critical
	// path: a sandbox is made but nothing runs in it. A later Run or
	// Restore in this slot of a workload that matches w (same template,
	// actor and root filesystems, the same mounts at the same guest paths;
	// host directories may differ and need not exist yet) uses it and
	// skips the sandbox's boot. A runtime may let a Restore of another
	// actor of the same shape use it too, giving the restored workload
	// its own identity (hostname) before returning; never a Run, whose
	// workload would start under the other name. Any other start discards
	// it first, so warming never changes what runs, only how fast it
	// starts. A warm
	// slot runs nothing: Stats reports Warm, Checkpoint fails with
	// ErrNotRunning, Sandboxes lists it and Terminate removes it. ErrBusy
	// if a workload occupies the slot; warming again for a matching
	// workload does nothing, for another replaces the warm sandbox.
	Warm(ctx context.Context, slot Slot, w Workload) error
}

// Exit is how a container of a slot's workload ended on its own.
type Exit struct {
	Container string
	// Status is the exit status, 128+N for a process killed by signal N;
	// meaningless when Known is false (the sandbox ended before its
	// status could be read).
	Status int
	Known  bool
}
