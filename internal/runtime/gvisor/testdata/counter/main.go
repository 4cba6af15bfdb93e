// Command counter is the test workload: an HTTP server whose state lives in
// memory (a counter and a touched buffer), in the root filesystem and in a
// durable volume, so a test can tell which of them a restore brought back.
package main

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

const (
	volumeLog = "/data/state.log" // the durable volume
	rootfsLog = "/state.log"      // the root filesystem (sandbox overlay)
)

// Run as "counter exit N" it exits with status N at once, as "counter
// hostname NAME" with status 0 if the hostname is NAME (else 1, printing
// it), as "counter exists PATH" with status 0 if PATH exists (else 1):
// commands for exec tests. Otherwise it serves on $PORT (default 8080).
func main() {
	if len(os.Args) == 3 && os.Args[1] == "exists" {
		if _, err := os.Stat(os.Args[2]); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) == 3 && os.Args[1] == "exit" {
		code, _ := strconv.Atoi(os.Args[2])
		fmt.Printf("exiting with %d\n", code)
		os.Exit(code)
	}
	if len(os.Args) == 3 && os.Args[1] == "hostname" {
		name, err := os.Hostname()
		if err != nil || name != os.Args[2] {
			fmt.Printf("hostname %q (%v), want %q\n", name, err, os.Args[2])
			os.Exit(1)
		}
		os.Exit(0)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	var count atomic.Int64
	// Memory the checkpoint has to carry.
	ballast := make([]byte, 4<<20)
	for i := range ballast {
		ballast[i] = byte(i)
	}
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok", ballast[len(ballast)-1])
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n := count.Add(1)
		for _, p := range []string{volumeLog, rootfsLog} {
			if err := appendLine(p, n); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		fmt.Fprintf(w, "count=%d volume=%d rootfs=%d greeting=%s\n", n, lines(volumeLog), lines(rootfsLog), os.Getenv("GREETING"))
	})
	if err := http.ListenAndServe(":"+port, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func appendLine(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "request %d\n", n); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func lines(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), "\n")
}
