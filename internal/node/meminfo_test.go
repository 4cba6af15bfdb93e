package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHostMemory(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content    string
		available, total int64
		wantErr          string
	}{
		{"kernel format", "MemTotal:       24683656 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n", 20000000 << 10, 24683656 << 10, ""},
		{"no MemAvailable", "MemTotal:       24683656 kB\nMemFree:         1000 kB\n", 0, 0, "no MemAvailable or MemTotal"},
		{"garbled", "MemTotal:       lots kB\nMemAvailable: 1 kB\n", 0, 0, "MemTotal: lots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			avail, total, err := hostMemory(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || avail != tc.available || total != tc.total {
				t.Fatalf("got %d, %d, %v; want %d, %d", avail, total, err, tc.available, tc.total)
			}
		})
	}
	if avail, total, err := hostMemory(meminfoPath); err != nil || avail <= 0 || total < avail {
		t.Fatalf("this host: %d of %d, %v", avail, total, err)
	}
}
