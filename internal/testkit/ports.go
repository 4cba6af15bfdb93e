package testkit

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
)

// Ports are handed out from below the kernel's ephemeral range (32768-60999
// by default), which the kernel never gives to a ":0" listener or an
// outgoing connection. A port picked from that range and released, as
// "listen on :0, close, pass the port on" does, can be taken by any test
// running alongside before its program binds it (CI saw "bind: address
// already in use" and a health check answered by another test's server).
const (
	firstPort = 20000
	portCount = 12000
)

var ports struct {
	sync.Mutex
	started bool
	next    int
}

// Port is a loopback port nothing listened on when asked, never handed out
// twice by this process. Processes start at different points of the range
// (by process id), so two test binaries rarely ask for the same ports.
func Port() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if !ports.started {
		ports.started, ports.next = true, os.Getpid()*7919%portCount
	}
	for range portCount {
		port := firstPort + ports.next%portCount
		ports.next++
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d", firstPort, firstPort+portCount-1)
}

// FreePort is Port for a test, which it fails when none is free.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := Port()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// FreeAddr is a free loopback address, host and port.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}
