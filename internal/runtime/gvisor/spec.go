package gvisor

import (
	"strings"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// The subset of the OCI runtime spec (v1.0) runsc needs. runsc validates a
// restore's spec against the checkpointed one (args, cwd, mounts by
// destination, capabilities, namespace types...), so the spec must be a pure
// function of the workload: only paths (rootfs, mount sources, namespace)
// and env may differ between the run and a restore in another slot.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname,omitempty"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
	// Annotations place a container in a sandbox of several.
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	User         ociUser         `json:"user"`
	Args         []string        `json:"args"`
	Env          []string        `json:"env"`
	Cwd          string          `json:"cwd"`
	Capabilities ociCapabilities `json:"capabilities"`
	Rlimits      []ociRlimit     `json:"rlimits"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces []ociNamespace `json:"namespaces"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// The capabilities runsc's own default spec grants: enough to bind low
// ports and signal own processes.
var defaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// buildSpec makes the spec of container c of workload w, whose root
// filesystem is mounted at rootfs, in the network namespace at netns.
func buildSpec(w runtime.Workload, c runtime.Checked, rootfs, netns string, annotations map[string]string) ociSpec {
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, m := range c.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, ociMount{Destination: m.Guest, Type: "bind", Source: m.Host, Options: []string{"rbind", mode}})
	}
	return ociSpec{
		Version: "1.0.0",
		Process: ociProcess{
			User: ociUser{UID: c.Process.UID, GID: c.Process.GID},
			Args: c.Process.Args,
			Env:  c.Process.Env,
			Cwd:  c.Process.Cwd,
			Capabilities: ociCapabilities{
				Bounding: defaultCaps, Effective: defaultCaps, Inheritable: defaultCaps, Permitted: defaultCaps,
			},
			Rlimits: []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
		},
		// Writable: writes land in runsc's in-memory root overlay (part of
		// the checkpoint), never in rootfs.
		Root:     ociRoot{Path: rootfs},
		Hostname: hostnameOf(w.Actor),
		Mounts:   mounts,
		Linux: ociLinux{Namespaces: []ociNamespace{
			{Type: "pid"}, {Type: "network", Path: netns}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
		}},
		Annotations: annotations,
	}
}

// hostnameOf is the hostname of actor's sandboxes: its name, if that is
// a hostname (a golden build's stand-in is not), else none.
func hostnameOf(actor string) string {
	if validHostname(actor) {
		return actor
	}
	return ""
}

// validHostname accepts DNS-1123 labels, which actor names are.
func validHostname(s string) bool {
	if s == "" || len(s) > 63 || strings.HasPrefix(s, "-") || strings.HasSuffix(s, "-") {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
