// Package s3test runs a real S3-compatible server (Versity's S3 gateway
// over a temporary directory, built by `make s3server`) for tests of the
// S3 snapshot storage.
package s3test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// Credentials the server accepts; Location exports them as
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for the code under test.
const (
	AccessKey = "torpor-test"
	SecretKey = "torpor-test-secret"
)

// Location starts a server with an empty bucket, stopped when tb ends,
// and returns its s3:// location (with prefix, if not empty).
func Location(tb testing.TB, prefix string) string {
	tb.Helper()
	bin := os.Getenv("TORPOR_VERSITYGW")
	if bin == "" {
		root, err := runtimetest.ModuleRoot()
		if err != nil {
			tb.Fatal(err)
		}
		bin = filepath.Join(root, "bin", "versitygw")
	}
	if _, err := os.Stat(bin); err != nil {
		tb.Fatalf("S3 test server not found at %s (%v): run `make s3server`, or set TORPOR_VERSITYGW", bin, err)
	}
	dir := tb.TempDir()
	const bucket = "snapshots"
	if err := os.Mkdir(filepath.Join(dir, bucket), 0o755); err != nil {
		tb.Fatal(err)
	}
	addr := testkit.FreeAddr(tb)
	cmd := exec.Command(bin, "--port", addr, "--access", AccessKey, "--secret", SecretKey, "--quiet", "posix", dir)
	logPath := filepath.Join(tb.TempDir(), "versitygw.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() //nolint:errcheck // killed on cleanup
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			tb.Fatalf("the S3 test server exited: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the S3 test server does not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Setenv("AWS_ACCESS_KEY_ID", AccessKey)
	tb.Setenv("AWS_SECRET_ACCESS_KEY", SecretKey)
	location := "s3://" + bucket
	if prefix != "" {
		location += "/" + prefix
	}
	return fmt.Sprintf("%s?endpoint=%s&insecure=true", location, addr)
}
