package storetest

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// RoundTrips puts a counting TCP proxy in front of the PostgreSQL server of
// postgresURL and returns the URL that goes through it, and the count of
// round trips made through it so far. A round trip is the client sending
// after the server last answered: messages the client sends without
// waiting for an answer in between (a pipeline) count once. Connection
// setup counts too, so a benchmark reads the counter after warming up.
func RoundTrips(tb testing.TB, postgresURL string) (string, *atomic.Int64) {
	tb.Helper()
	u, err := url.Parse(postgresURL)
	if err != nil {
		tb.Fatalf("storetest: round trips: %v", err)
	}
	target := u.Host
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("storetest: round trips: %v", err)
	}
	var count atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				tb.Errorf("storetest: round trips: dial %s: %v", target, err)
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			// answered: the server spoke since the client last did.
			var answered atomic.Bool
			answered.Store(true)
			wg.Go(func() {
				relay(server, client, func() {
					if answered.Swap(false) {
						count.Add(1)
					}
				})
			})
			wg.Go(func() { relay(client, server, func() { answered.Store(true) }) })
		}
	})
	u.Host = l.Addr().String()
	return u.String(), &count
}

// relay copies from src to dst until either side closes, then closes
// both. sent runs for each chunk before it is passed on, so the other side
// cannot answer before the chunk is counted.
func relay(dst, src net.Conn, sent func()) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			sent()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
