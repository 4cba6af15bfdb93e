package runtime

import (
	"fmt"
	"os"
	"strings"
)

// MountsUnder lists the mount points below dir, as this process's mount
// namespace has them: what a sandbox's cleanup must have unmounted, and
// what a node's cleanup finds left over.
func MountsUnder(dir string) ([]string, error) {
	body, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("mounts under %s: %w", dir, err)
	}
	var out []string
	for line := range strings.SplitSeq(string(body), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out, nil
}
