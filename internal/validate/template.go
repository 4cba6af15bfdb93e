package validate

import (
	"fmt"
	"path"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// ImagePinned reports whether an image reference is pinned by digest; the
// server stores only pinned references so a template never changes when a
// tag moves.
type ImagePinned func(ref string) bool

// Template checks a template as submitted (before defaults).
func Template(t *torporv1.Template, pinned ImagePinned) error {
	if err := Meta(t.GetMetadata(), true); err != nil {
		return err
	}
	spec := t.GetSpec()
	if spec == nil {
		return fieldErr("spec", "required")
	}
	if len(spec.GetContainers()) == 0 {
		return fieldErr("spec.containers", "at least one container is required")
	}
	if len(spec.GetContainers()) > maxContainers {
		return fieldErr("spec.containers", "more than %d containers", maxContainers)
	}
	if len(spec.GetVolumes()) > maxVolumes {
		return fieldErr("spec.volumes", "more than %d volumes", maxVolumes)
	}
	volumes := map[string]bool{}
	for i, v := range spec.GetVolumes() {
		p := fmt.Sprintf("spec.volumes[%d]", i)
		if err := Name(p+".name", v.GetName()); err != nil {
			return err
		}
		if _, dup := volumes[v.GetName()]; dup {
			return fieldErr(p+".name", "duplicate volume %q", v.GetName())
		}
		volumes[v.GetName()] = false
		if v.GetKind() == torporv1.VolumeKind_VOLUME_KIND_UNSPECIFIED {
			return fieldErr(p+".kind", "required (DURABLE)")
		}
	}
	containers := map[string]bool{}
	for i, c := range spec.GetContainers() {
		p := fmt.Sprintf("spec.containers[%d]", i)
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
			return fieldErr(fmt.Sprintf("spec.volumes[%d]", i), "volume %q is not mounted by any container", v.GetName())
		}
	}
	if r := spec.GetResources(); r.GetMemoryMb() < 0 || r.GetCpuMillis() < 0 {
		return fieldErr("spec.resources", "must not be negative")
	}
	if err := snapshotPolicy(spec.GetSnapshotPolicy()); err != nil {
		return err
	}
	if ip := spec.GetIdlePolicy(); ip.GetIdleSeconds() < 0 {
		return fieldErr("spec.idlePolicy.idleSeconds", "must not be negative")
	} else if ip.GetIdleSeconds() > 0 && ip.GetAction() == torporv1.IdleAction_IDLE_ACTION_UNSPECIFIED {
		return fieldErr("spec.idlePolicy.action", "required when idleSeconds is set (PAUSE or SUSPEND)")
	}
	return nil
}

func container(p string, c *torporv1.Container, volumes map[string]bool, pinned ImagePinned) error {
	if c.GetImage() == "" {
		return fieldErr(p+".image", "required")
	}
	if pinned != nil && !pinned(c.GetImage()) {
		return fieldErr(p+".image", "%q is not pinned by digest (name@sha256:...); `torpor template apply` pins tags", c.GetImage())
	}
	for _, list := range []struct {
		name string
		vals []string
	}{{"command", c.GetCommand()}, {"args", c.GetArgs()}} {
		if len(list.vals) > maxStringsInList {
			return fieldErr(p+"."+list.name, "more than %d entries", maxStringsInList)
		}
		for j, s := range list.vals {
			if len(s) > maxStringLen {
				return fieldErr(fmt.Sprintf("%s.%s[%d]", p, list.name, j), "longer than %d bytes", maxStringLen)
			}
		}
	}
	envs := map[string]bool{}
	for j, e := range c.GetEnv() {
		ep := fmt.Sprintf("%s.env[%d].name", p, j)
		if e.GetName() == "" {
			return fieldErr(ep, "required")
		}
		if envs[e.GetName()] {
			return fieldErr(ep, "duplicate variable %q", e.GetName())
		}
		envs[e.GetName()] = true
	}
	if probe := c.GetReadinessProbe(); probe != nil {
		if err := readinessProbe(p+".readinessProbe", probe); err != nil {
			return err
		}
	}
	paths := map[string]bool{}
	for j, m := range c.GetMounts() {
		mp := fmt.Sprintf("%s.mounts[%d]", p, j)
		if _, ok := volumes[m.GetVolume()]; !ok {
			return fieldErr(mp+".volume", "volume %q is not declared in spec.volumes", m.GetVolume())
		}
		volumes[m.GetVolume()] = true
		if !path.IsAbs(m.GetPath()) || path.Clean(m.GetPath()) != m.GetPath() || m.GetPath() == "/" {
			return fieldErr(mp+".path", "%q must be a clean absolute path other than /", m.GetPath())
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
	if e := probe.GetExec(); e != nil {
		actions = append(actions, "exec")
		cmd := e.GetCommand()
		switch {
		case len(cmd) == 0 || cmd[0] == "":
			return fieldErr(p+".exec.command", "required: the program to run and its arguments")
		case len(cmd) > maxStringsInList:
			return fieldErr(p+".exec.command", "more than %d entries", maxStringsInList)
		}
		for j, s := range cmd {
			if len(s) > maxStringLen {
				return fieldErr(fmt.Sprintf("%s.exec.command[%d]", p, j), "longer than %d bytes", maxStringLen)
			}
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

func snapshotPolicy(sp *torporv1.SnapshotPolicy) error {
	if sp.GetKeep() < 0 {
		return fieldErr("spec.snapshotPolicy.keep", "must not be negative")
	}
	onPause := orFull(sp.GetOnPause())
	onCommit := orFull(sp.GetOnCommit())
	if onPause == torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA && onCommit == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL {
		return fieldErr("spec.snapshotPolicy.onCommit", "FULL is wider than onPause DATA (onCommit must be a subset of onPause)")
	}
	return nil
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
		spec.SandboxClass = "gvisor"
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
