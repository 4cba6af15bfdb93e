package gvisor

// A sandbox's CPU time, from the host's process accounting. runsc's
// `events --stats` scales the sentry's own accounting by the CPU use of
// the sandbox's cgroup; with --ignore-cgroups the sandbox is in the node
// agent's cgroup (often the root one), so that reports the host's. The
// sandbox is a tree of host processes instead: the sentry (runsc
// state's pid) and, under systrap, the stub processes its guest runs
// in. Their user and system time, with that of the children they reaped,
// is what the sandbox used.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of /proc/PID/stat's times: USER_HZ, 100 on
// every Linux architecture (it is part of the kernel's ABI).
const clockTick = 10 * time.Millisecond

// procStat is what CPU accounting needs of /proc/PID/stat.
type procStat struct {
	ppid int
	// utime+stime+cutime+cstime, in clock ticks.
	ticks int64
}

// parseProcStat reads /proc/PID/stat's content. The command name (field
// 2) is in parentheses and may hold spaces and parentheses itself: the
// fields that follow start after the last ")".
func parseProcStat(b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return procStat{}, fmt.Errorf("no command name in %q", b)
	}
	// From field 3 (state) on: ppid is 4, utime..cstime 14..17.
	f := bytes.Fields(b[end+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("%d fields after the command name, want 15 or more", len(f))
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, fmt.Errorf("ppid: %w", err)
	}
	st := procStat{ppid: ppid}
	for _, field := range f[11:15] {
		n, err := strconv.ParseInt(string(field), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("cpu time: %w", err)
		}
		st.ticks += n
	}
	return st, nil
}

// treeCPU is the CPU time the process pid and its descendants used,
// read from the proc filesystem at procRoot. A process that exits while
// the tree is read is left out (its parent counts it once it reaps it).
func treeCPU(procRoot string, pid int) (time.Duration, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, err
	}
	stats := map[int]procStat{}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		st, err := parseProcStat(b)
		if err != nil {
			return 0, fmt.Errorf("process %d: %w", p, err)
		}
		stats[p] = st
		children[st.ppid] = append(children[st.ppid], p)
	}
	if _, ok := stats[pid]; !ok {
		return 0, fmt.Errorf("process %d: %w", pid, os.ErrNotExist)
	}
	var ticks int64
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		ticks += stats[p].ticks
		queue = append(queue, children[p]...)
	}
	return time.Duration(ticks) * clockTick, nil
}
