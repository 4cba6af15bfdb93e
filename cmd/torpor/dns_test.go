package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDNSUpstreams: --dns, else the host's nameservers (a loopback one
// kept: the node's resolver runs on the host), each as ip:port.
func TestDNSUpstreams(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("# systemd-resolved\nnameserver 127.0.0.53\noptions edns0\nnameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		flag string
		want []string
	}{
		{"", []string{"127.0.0.53:53", "192.0.2.1:53"}},
		{"198.51.100.1, 203.0.113.1:5353", []string{"198.51.100.1:53", "203.0.113.1:5353"}},
	}
	for _, tc := range cases {
		got, err := dnsUpstreams(tc.flag, conf)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("dnsUpstreams(%q) = %v, %v; want %v", tc.flag, got, err, tc.want)
		}
	}
	if _, err := dnsUpstreams("not-an-address", conf); err == nil {
		t.Error("dnsUpstreams(not-an-address) did not fail")
	}
}
