package main

import (
	"os"
	"os/signal"
	"syscall"
)

// survivePipeReaders keeps a process role alive when the reader of its
// standard output or error goes away (`torpor up | tee up.log`, then
// Ctrl-C, which ends tee first): Go's default is to die of SIGPIPE on such
// a write, which would end a shutdown halfway and leave sandboxes,
// mounts and the workers' network behind. With SIGPIPE delivered to a
// channel the write fails with EPIPE instead, and the log line is lost,
// not the shutdown. A channel, not signal.Ignore: an ignored signal
// stays ignored in the runsc processes started after it. The channel is
// never read; the signal package drops what it cannot deliver.
func survivePipeReaders() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}
