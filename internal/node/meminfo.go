package node

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// meminfoPath is the kernel's account of the host's memory.
const meminfoPath = "/proc/meminfo"

// hostMemory reads the host's available and total memory in bytes
// (MemAvailable, MemTotal), which each heartbeat carries: the control
// plane takes frozen actors down the idle ladder on a node short of it.
func hostMemory(path string) (available, total int64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("host memory: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var into *int64
		switch string(f[0]) {
		case "MemAvailable:":
			into = &available
		case "MemTotal:":
			into = &total
		default:
			continue
		}
		kib, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("host memory: %s %s: %w", f[0], f[1], err)
		}
		*into = kib << 10
	}
	if available == 0 || total == 0 {
		return 0, 0, fmt.Errorf("host memory: %s has no MemAvailable or MemTotal", path)
	}
	return available, total, nil
}
