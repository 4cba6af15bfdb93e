package testkit

import (
	"net"
	"testing"
)

func TestFreePortIsOutsideTheEphemeralRangeAndNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		port := FreePort(t)
		if port < firstPort || port >= 32768 {
			t.Fatalf("port %d: want one in %d-32767", port, firstPort)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
	}
	// A port in use is skipped.
	ln, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ports.Lock()
	ports.next-- // the one just handed out, now bound
	ports.Unlock()
	if got, bound := FreePort(t), ln.Addr().(*net.TCPAddr).Port; got == bound {
		t.Fatalf("port %d handed out while bound", got)
	}
}
