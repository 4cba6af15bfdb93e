package validate

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// DefaultSandboxClass is the class of a template that names none, and the
// one every installation offers.
const DefaultSandboxClass = "gvisor"

// ReservedPath is where Torpor puts what it provides inside a sandbox (the
// workload identity, node.IdentityMountPath): no volume may be mounted
// there, below it or above it, where it would hide it.
const ReservedPath = "/run/torpor"

// ImagePinned reports whether an image reference is pinned by digest; the
// server stores only pinned references so a template never changes when a
// tag moves.
type ImagePinned func(ref string) bool

// Template checks a template as submitted (before defaults).
func Template(t *torporv1.Template, pinned ImagePinned) error {
	if err := Meta(t.GetMetadata(), true); err != nil {
		return err
	}
	return TemplateSpec("spec", t.GetSpec(), pinned)
}

// TemplateSpec checks a template's spec found at path ("spec" in a
// template; nodes check the one a workload carries again).
func TemplateSpec(at string, spec *torporv1.TemplateSpec, pinned ImagePinned) error {
	if spec == nil {
		return fieldErr(at, "required")
	}
	if len(spec.GetContainers()) == 0 {
		return fieldErr(at+".containers", "at least one container is required")
	}
	if len(spec.GetContainers()) > maxContainers {
		return fieldErr(at+".containers", "more than %d containers", maxContainers)
	}
	if len(spec.GetVolumes()) > maxVolumes {
		return fieldErr(at+".volumes", "more than %d volumes", maxVolumes)
	}
	volumes := map[string]bool{}
	for i, v := range spec.GetVolumes() {
		p := fmt.Sprintf("%s.volumes[%d]", at, i)
		if err := Name(p+".name", v.GetName()); err != nil {
			return err
		}
		if _, dup := volumes[v.GetName()]; dup {
			return fieldErr(p+".name", "duplicate volume %q", v.GetName())
		}
		volumes[v.GetName()] = false
		if v.GetKind() != torporv1.VolumeKind_VOLUME_KIND_DURABLE {
			return fieldErr(p+".kind", "%s: want DURABLE", v.GetKind())
		}
	}
	containers := map[string]bool{}
	for i, c := range spec.GetContainers() {
		p := fmt.Sprintf("%s.containers[%d]", at, i)
		if err := Name(p+".name", c.GetName()); err != nil {
			return err
		}
		if containers[c.GetName()] {
			return fieldErr(p+".name", "duplicate container %q", c.GetName())
		}
		containers[c.GetName()] = true
		if err := container(p, c, volumes, pinned); err != nil {
			return err
		}
	}
	for i, v := range spec.GetVolumes() {
		if !volumes[v.GetName()] {
			return fieldErr(fmt.Sprintf("%s.volumes[%d]", at, i), "volume %q is not mounted by any container", v.GetName())
		}
	}
	if len(spec.GetSandboxClass()) > maxNameLen {
		return fieldErr(at+".sandboxClass", "longer than %d characters", maxNameLen)
	}
	if r := spec.GetResources(); r.GetMemoryMb() < 0 || r.GetCpuMillis() < 0 {
		return fieldErr(at+".resources", "must not be negative")
	}
	if err := snapshotPolicy(at+".snapshotPolicy", spec.GetSnapshotPolicy()); err != nil {
		return err
	}
	ip := spec.GetIdlePolicy()
	switch ip.GetAction() {
	case torporv1.IdleAction_IDLE_ACTION_UNSPECIFIED, torporv1.IdleAction_IDLE_ACTION_PAUSE, torporv1.IdleAction_IDLE_ACTION_SUSPEND:
	default:
		return fieldErr(at+".idlePolicy.action", "%s: want PAUSE or SUSPEND", ip.GetAction())
	}
	if ip.GetIdleSeconds() < 0 {
		return fieldErr(at+".idlePolicy.idleSeconds", "must not be negative")
	} else if ip.GetIdleSeconds() > 0 && ip.GetAction() == torporv1.IdleAction_IDLE_ACTION_UNSPECIFIED {
		return fieldErr(at+".idlePolicy.action", "required when idleSeconds is set (PAUSE or SUSPEND)")
	}
	switch f := ip.GetFreezeSeconds(); {
	case f < 0:
		return fieldErr(at+".idlePolicy.freezeSeconds", "must not be negative")
	case f > 0 && ip.GetIdleSeconds() > 0 && f >= ip.GetIdleSeconds():
		return fieldErr(at+".idlePolicy.freezeSeconds", "%d must be less than idleSeconds (%d): an actor is frozen before its idle action, which stops it", f, ip.GetIdleSeconds())
	}
	if ip.GetEviction().GetMinIdleSeconds() < 0 {
		return fieldErr(at+".idlePolicy.eviction.minIdleSeconds", "must not be negative")
	}
	if _, ok := torporv1.RestartPolicy_name[int32(spec.GetRestartPolicy())]; !ok {
		return fieldErr(at+".restartPolicy", "%d: want ALWAYS, ON_FAILURE or NEVER", spec.GetRestartPolicy())
	}
	if n := spec.GetWarmWorkers(); n < 0 || n > maxWarmWorkers {
		return fieldErr(at+".warmWorkers", "%d: want 0 to %d (free workers kept warm for the template)", n, maxWarmWorkers)
	}
	// Last: each field within its own limit may still add up.
	if n := proto.Size(spec); n > maxTemplateBytes {
		return fieldErr(at, "is %d bytes encoded, more than %d", n, maxTemplateBytes)
	}
	return nil
}

// Images checks every container's image with allowed (the installation's
// image policy), naming the container whose image it refuses.
func Images(t *torporv1.Template, allowed func(ref string) error) error {
	for i, c := range t.GetSpec().GetContainers() {
		if err := allowed(c.GetImage()); err != nil {
			return fieldErr(fmt.Sprintf("spec.containers[%d].image", i), "%v", err)
		}
	}
	return nil
}

// SandboxClass checks that t's sandbox class is one of offered (the known
// classes and those of registered nodes): a class nothing runs would leave
// the template waiting for a worker forever.
func SandboxClass(t *torporv1.Template, offered []string) error {
	class := t.GetSpec().GetSandboxClass()
	if class == "" || slices.Contains(offered, class) {
		return nil
	}
	return fieldErr("spec.sandboxClass", "%q is not a sandbox class of this installation (offered: %s)", class, strings.Join(offered, ", "))
}

func container(p string, c *torporv1.Container, volumes map[string]bool, pinned ImagePinned) error {
	if c.GetImage() == "" {
		return fieldErr(p+".image", "required")
	}
	if pinned != nil && !pinned(c.GetImage()) {
		return fieldErr(p+".image", "%q is not pinned by digest (name@sha256:...); `torpor template apply` pins tags", c.GetImage())
	}
	argBytes := 0
	for _, list := range []struct {
		name string
		vals []string
	}{{"command", c.GetCommand()}, {"args", c.GetArgs()}} {
		if err := argv(p+"."+list.name, list.vals); err != nil {
			return err
		}
		for _, s := range list.vals {
			argBytes += len(s)
		}
	}
	if argBytes > maxArgBytes {
		return fieldErr(p+".args", "command and args hold %d bytes, more than %d", argBytes, maxArgBytes)
	}
	if len(c.GetEnv()) > maxEnv {
		return fieldErr(p+".env", "%d variables, more than %d", len(c.GetEnv()), maxEnv)
	}
	envs := map[string]bool{}
	envBytes := 0
	for j, e := range c.GetEnv() {
		ep := fmt.Sprintf("%s.env[%d]", p, j)
		switch name := e.GetName(); {
		case name == "":
			return fieldErr(ep+".name", "required")
		case len(name) > maxEnvNameLen:
			return fieldErr(ep+".name", "longer than %d bytes", maxEnvNameLen)
		case strings.ContainsAny(name, "=\x00"):
			return fieldErr(ep+".name", "%q: a variable's name holds no '=' and no NUL", name)
		case envs[name]:
			return fieldErr(ep+".name", "duplicate variable %q", name)
		}
		if strings.ContainsRune(e.GetValue(), 0) {
			return fieldErr(ep+".value", "holds a NUL byte")
		}
		envs[e.GetName()] = true
		envBytes += len(e.GetName()) + len(e.GetValue())
	}
	if envBytes > maxEnvBytes {
		return fieldErr(p+".env", "names and values hold %d bytes, more than %d", envBytes, maxEnvBytes)
	}
	if wd := c.GetWorkingDir(); wd != "" {
		if err := absPath(p+".workingDir", wd); err != nil {
			return err
		}
	}
	if c.GetPort() != 0 {
		if err := port(p+".port", c.GetPort()); err != nil {
			return err
		}
	}
	if probe := c.GetReadinessProbe(); probe != nil {
		if err := readinessProbe(p+".readinessProbe", probe); err != nil {
			return err
		}
	}
	if len(c.GetMounts()) > maxMounts {
		return fieldErr(p+".mounts", "more than %d mounts", maxMounts)
	}
	paths := map[string]bool{}
	for j, m := range c.GetMounts() {
		mp := fmt.Sprintf("%s.mounts[%d]", p, j)
		if _, ok := volumes[m.GetVolume()]; !ok {
			return fieldErr(mp+".volume", "volume %q is not declared in the template's volumes", m.GetVolume())
		}
		volumes[m.GetVolume()] = true
		if !path.IsAbs(m.GetPath()) || path.Clean(m.GetPath()) != m.GetPath() || m.GetPath() == "/" {
			return fieldErr(mp+".path", "%q must be a clean absolute path other than /", m.GetPath())
		}
		if err := absPath(mp+".path", m.GetPath()); err != nil {
			return err
		}
		if within(m.GetPath(), ReservedPath) || within(ReservedPath, m.GetPath()) {
			return fieldErr(mp+".path", "%q would hide %s, where Torpor puts the workload's identity", m.GetPath(), ReservedPath)
		}
		if paths[m.GetPath()] {
			return fieldErr(mp+".path", "%q is mounted twice", m.GetPath())
		}
		paths[m.GetPath()] = true
	}
	return nil
}

func readinessProbe(p string, probe *torporv1.Probe) error {
	var actions []string
	if h := probe.GetHttpGet(); h != nil {
		actions = append(actions, "httpGet")
		if err := port(p+".httpGet.port", h.GetPort()); err != nil {
			return err
		}
	}
	if tcp := probe.GetTcpSocket(); tcp != nil {
		actions = append(actions, "tcpSocket")
		if err := port(p+".tcpSocket.port", tcp.GetPort()); err != nil {
			return err
		}
	}
	if h := probe.GetHttpGet(); h != nil && h.GetPath() != "" {
		if err := absPath(p+".httpGet.path", h.GetPath()); err != nil {
			return err
		}
		if strings.ContainsFunc(h.GetPath(), func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fieldErr(p+".httpGet.path", "%q holds a space or control character", h.GetPath())
		}
	}
	if e := probe.GetExec(); e != nil {
		actions = append(actions, "exec")
		cmd := e.GetCommand()
		if len(cmd) == 0 || cmd[0] == "" {
			return fieldErr(p+".exec.command", "required: the program to run and its arguments")
		}
		if err := argv(p+".exec.command", cmd); err != nil {
			return err
		}
	}
	switch len(actions) {
	case 0:
		return fieldErr(p, "one of httpGet, tcpSocket or exec is required")
	case 1:
	default:
		return fieldErr(p, "sets %s: set exactly one", strings.Join(actions, " and "))
	}
	if probe.GetTimeoutSeconds() < 0 {
		return fieldErr(p+".timeoutSeconds", "must not be negative")
	}
	if probe.GetPeriodSeconds() < 0 {
		return fieldErr(p+".periodSeconds", "must not be negative")
	}
	return nil
}

func port(p string, n int32) error {
	if n <= 0 || n > 65535 {
		return fieldErr(p, "%d is not a port", n)
	}
	return nil
}

func snapshotPolicy(at string, sp *torporv1.SnapshotPolicy) error {
	if sp.GetKeep() < 0 {
		return fieldErr(at+".keep", "must not be negative")
	}
	for _, scope := range []struct {
		field string
		v     torporv1.SnapshotScope
	}{{"onPause", sp.GetOnPause()}, {"onCommit", sp.GetOnCommit()}} {
		switch scope.v {
		case torporv1.SnapshotScope_SNAPSHOT_SCOPE_UNSPECIFIED, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA:
		default:
			return fieldErr(at+"."+scope.field, "%s: want FULL or DATA", scope.v)
		}
	}
	switch fd := sp.GetOnResume().GetFromData(); fd {
	case torporv1.FromData_FROM_DATA_UNSPECIFIED, torporv1.FromData_FROM_DATA_COLD_BOOT, torporv1.FromData_FROM_DATA_GOLDEN:
	default:
		return fieldErr(at+".onResume.fromData", "%s: want COLD_BOOT or GOLDEN", fd)
	}
	onPause := orFull(sp.GetOnPause())
	onCommit := orFull(sp.GetOnCommit())
	if onPause == torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA && onCommit == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL {
		return fieldErr(at+".onCommit", "FULL is wider than onPause DATA (onCommit must be a subset of onPause)")
	}
	return nil
}

// argv checks an argument vector: what execve can carry, within limits.
func argv(at string, vals []string) error {
	if len(vals) > maxStringsInList {
		return fieldErr(at, "more than %d entries", maxStringsInList)
	}
	for j, s := range vals {
		if len(s) > maxStringLen {
			return fieldErr(fmt.Sprintf("%s[%d]", at, j), "longer than %d bytes", maxStringLen)
		}
		if strings.ContainsRune(s, 0) {
			return fieldErr(fmt.Sprintf("%s[%d]", at, j), "holds a NUL byte")
		}
	}
	return nil
}

// absPath checks a path inside the sandbox.
func absPath(at, p string) error {
	switch {
	case !path.IsAbs(p):
		return fieldErr(at, "%q is not an absolute path", p)
	case len(p) > maxPathLen:
		return fieldErr(at, "longer than %d bytes", maxPathLen)
	case strings.ContainsRune(p, 0):
		return fieldErr(at, "holds a NUL byte")
	}
	return nil
}

// within reports whether the clean path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func orFull(s torporv1.SnapshotScope) torporv1.SnapshotScope {
	if s == torporv1.SnapshotScope_SNAPSHOT_SCOPE_UNSPECIFIED {
		return torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL
	}
	return s
}

// ApplyTemplateDefaults fills what a template leaves out, so stored
// templates are explicit.
func ApplyTemplateDefaults(spec *torporv1.TemplateSpec) {
	if spec.SandboxClass == "" {
		spec.SandboxClass = DefaultSandboxClass
	}
	if spec.SnapshotPolicy == nil {
		spec.SnapshotPolicy = &torporv1.SnapshotPolicy{}
	}
	sp := spec.SnapshotPolicy
	sp.OnPause = orFull(sp.OnPause)
	sp.OnCommit = orFull(sp.OnCommit)
	if sp.OnResume == nil {
		sp.OnResume = &torporv1.OnResume{}
	}
	if sp.OnResume.FromData == torporv1.FromData_FROM_DATA_UNSPECIFIED {
		sp.OnResume.FromData = torporv1.FromData_FROM_DATA_COLD_BOOT
	}
	if sp.Keep == 0 {
		sp.Keep = 2
	}
	for _, c := range spec.Containers {
		if p := c.ReadinessProbe; p != nil && p.TimeoutSeconds == 0 {
			p.TimeoutSeconds = 30
		}
	}
}
