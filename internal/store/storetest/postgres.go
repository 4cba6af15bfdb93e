package storetest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"

	"github.com/torpor-dev/torpor/internal/testkit"
)

// Postgres is a private PostgreSQL server for tests that stop and restart
// the database under a running store, which the shared server of URL must
// never suffer.
type Postgres struct {
	bin   string // directory of initdb and pg_ctl
	dir   string // owns data/, the unix socket and the log
	port  int
	runAs []string // command prefix that runs a program as the postgres user
}

// StartPostgres initialises and starts a PostgreSQL server of its own on a
// free loopback port, with trust authentication and fsync off, and removes
// it when tb ends.
func StartPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		tb.Fatal("storetest: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (install postgresql)")
	}
	// The newest major version, as the package manager would run it.
	sort.Slice(bins, func(i, j int) bool { return majorOf(bins[i]) > majorOf(bins[j]) })
	p := &Postgres{bin: filepath.Dir(bins[0])}

	// initdb and postgres refuse to run as root: as root, run them as the
	// postgres user in a directory it owns. tb.TempDir's parent is private
	// to root, so the directory is made here.
	dir, err := os.MkdirTemp("", "torpor-pg-")
	if err != nil {
		tb.Fatalf("storetest: temporary directory for PostgreSQL: %v", err)
	}
	p.dir = dir
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("storetest: remove PostgreSQL directory %s: %v", dir, err)
		}
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("storetest: PostgreSQL cannot run as root and there is no postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.runAs = []string{"runuser", "-u", "postgres", "--"}
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatalf("storetest: give %s to the postgres user: %v", dir, err)
		}
	}

	p.port = testkit.FreePort(tb)
	p.run(tb, "initdb", "-D", p.dataDir(), "-U", "postgres", "--auth=trust", "--no-sync", "--no-instructions", "-E", "UTF8")
	// fsync off: a stopped server loses nothing, as its writes sit in the
	// kernel's cache, and only an OS crash could lose them. Commits still
	// wait for their WAL to leave the server (synchronous_commit stays on),
	// so what was acknowledged survives Stop's immediate shutdown.
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"+
		"fsync = off\nfull_page_writes = off\n", p.port, p.dir)
	f, err := os.OpenFile(filepath.Join(p.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		tb.Fatalf("storetest: configure PostgreSQL: %v", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatalf("storetest: configure PostgreSQL: %v", err)
	}

	// Registered before the start so a start that half-succeeded is still
	// stopped; stopping a stopped server is not an error here.
	tb.Cleanup(func() {
		out, err := p.pgCtl("stop", "-m", "immediate").CombinedOutput()
		if err != nil && p.running() {
			tb.Errorf("storetest: stop PostgreSQL in %s: %v\n%s", p.dir, err, out)
		}
	})
	p.Start(tb)
	return p
}

// URL is a postgres:// URL of the server's database for store.Open.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Stop shuts the server down at once, as a crash would: no clean
// disconnects, open transactions lost.
func (p *Postgres) Stop(tb testing.TB) {
	tb.Helper()
	p.ctl(tb, "stop", "-m", "immediate")
}

// Start starts the stopped server and returns once it accepts connections.
func (p *Postgres) Start(tb testing.TB) {
	tb.Helper()
	p.ctl(tb, "start", "-l", filepath.Join(p.dir, "postgres.log"))
}

// Restart stops the server at once and starts it again, returning once it
// accepts connections: what a crash, failover or operator's restart looks
// like to clients. (pg_ctl restart cannot take -l, and without it the
// server would hold pg_ctl's output open.)
func (p *Postgres) Restart(tb testing.TB) {
	tb.Helper()
	p.Stop(tb)
	p.Start(tb)
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// ctl runs pg_ctl, waiting (-w) until the server is up or down.
func (p *Postgres) ctl(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := p.pgCtl(args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
		tb.Fatalf("storetest: pg_ctl %v in %s: %v\n%s\nserver log:\n%s", args, p.dir, err, out, log)
	}
}

func (p *Postgres) pgCtl(args ...string) *exec.Cmd {
	return p.command("pg_ctl", append([]string{"-D", p.dataDir(), "-w", "-t", "60"}, args...)...)
}

func (p *Postgres) running() bool {
	_, err := os.Stat(filepath.Join(p.dataDir(), "postmaster.pid"))
	return err == nil
}

func (p *Postgres) run(tb testing.TB, prog string, args ...string) {
	tb.Helper()
	if out, err := p.command(prog, args...).CombinedOutput(); err != nil {
		tb.Fatalf("storetest: %s %v: %v\n%s", prog, args, err, out)
	}
}

func (p *Postgres) command(prog string, args ...string) *exec.Cmd {
	argv := append(append([]string{}, p.runAs...), filepath.Join(p.bin, prog))
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.dir
	return cmd
}

func majorOf(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}
