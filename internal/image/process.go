package image

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/internal/fstree"
)

// DefaultPath is the PATH a process gets when neither its image nor its
// container sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ErrNoCommand: neither the container nor its image says what to run.
var ErrNoCommand = errors.New("nothing to run: the container has no command or args and its image has no ENTRYPOINT or CMD")

// EnvVar is one environment variable a container sets.
type EnvVar struct{ Name, Value string }

// Overrides are what a container sets over its image's configuration.
type Overrides struct {
	Command, Args []string
	Env           []EnvVar
	WorkingDir    string
}

// Process is what a container runs once its settings are merged over its
// image's configuration.
type Process struct {
	Args []string
	// Env holds NAME=value entries, each name once.
	Env []string
	Cwd string
	// User is the image's USER: "" (root), a name or uid, optionally with
	// ":group" (a name or gid); see LookupUser.
	User string
}

// Merge applies a container's settings over its image's configuration with
// Kubernetes' semantics: command replaces ENTRYPOINT and, unless args are
// given too, drops CMD; args replace CMD; env is the image's with the
// container's variables over it (the container wins); workingDir replaces
// WORKDIR (default /). The image's USER is kept. A process with nothing to
// run is ErrNoCommand.
func Merge(cfg v1.Config, o Overrides) (Process, error) {
	entrypoint, cmd := cfg.Entrypoint, cfg.Cmd
	if len(o.Command) > 0 {
		entrypoint, cmd = o.Command, nil
	}
	if len(o.Args) > 0 {
		cmd = o.Args
	}
	args := append(append([]string{}, entrypoint...), cmd...)
	if len(args) == 0 {
		return Process{}, ErrNoCommand
	}
	cwd := o.WorkingDir
	if cwd == "" {
		cwd = cfg.WorkingDir
	}
	// Docker takes a relative WORKDIR from /.
	cwd = path.Join("/", cwd)
	return Process{Args: args, Env: mergeEnv(cfg.Env, o.Env), Cwd: cwd, User: cfg.User}, nil
}

// mergeEnv is the image's NAME=value entries in their order, later ones
// replacing earlier ones of the same name as a shell would, then the
// container's variables, each replacing the image's in place or added at
// the end, and PATH if no one set it.
func mergeEnv(image []string, container []EnvVar) []string {
	var names []string
	values := map[string]string{}
	set := func(name, value string) {
		if _, ok := values[name]; !ok {
			names = append(names, name)
		}
		values[name] = value
	}
	for _, e := range image {
		name, value, _ := strings.Cut(e, "=")
		if name != "" {
			set(name, value)
		}
	}
	for _, e := range container {
		set(e.Name, e.Value)
	}
	if _, ok := values["PATH"]; !ok {
		set("PATH", DefaultPath)
	}
	env := make([]string, len(names))
	for i, name := range names {
		env[i] = name + "=" + values[name]
	}
	return env
}

// LookupUser resolves an image's USER (uid, name, uid:gid, name:group, ...)
// against the root filesystem at rootfs, as a container engine does: a name
// is looked up in its /etc/passwd or /etc/group; a user without a group
// gets the primary group /etc/passwd gives it, or 0 when it has no entry.
func LookupUser(rootfs, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(user, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return 0, 0, fmt.Errorf("user %q: want USER, USER:GROUP, UID or UID:GID", user)
	}
	id, numeric := parseID(userPart)
	entry, found, err := findEntry(rootfs, "etc/passwd", func(f []string) bool {
		if numeric {
			return len(f) > 2 && f[2] == userPart
		}
		return f[0] == userPart
	})
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", user, err)
	}
	switch {
	case numeric:
		uid = id
	case !found:
		return 0, 0, fmt.Errorf("user %q: no user %q in the image's /etc/passwd", user, userPart)
	default:
		if uid, err = passwdID(entry, 2); err != nil {
			return 0, 0, fmt.Errorf("user %q: /etc/passwd: %w", user, err)
		}
	}
	if !hasGroup {
		if !found {
			return uid, 0, nil
		}
		if gid, err = passwdID(entry, 3); err != nil {
			return 0, 0, fmt.Errorf("user %q: /etc/passwd: %w", user, err)
		}
		return uid, gid, nil
	}
	if gid, numeric = parseID(groupPart); numeric {
		return uid, gid, nil
	}
	entry, found, err = findEntry(rootfs, "etc/group", func(f []string) bool { return f[0] == groupPart })
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", user, err)
	}
	if !found {
		return 0, 0, fmt.Errorf("user %q: no group %q in the image's /etc/group", user, groupPart)
	}
	if gid, err = passwdID(entry, 2); err != nil {
		return 0, 0, fmt.Errorf("user %q: /etc/group: %w", user, err)
	}
	return uid, gid, nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

func passwdID(fields []string, i int) (uint32, error) {
	if len(fields) <= i {
		return 0, fmt.Errorf("entry %q has no field %d", fields[0], i+1)
	}
	id, ok := parseID(fields[i])
	if !ok {
		return 0, fmt.Errorf("entry %q: %q is not a numeric id", fields[0], fields[i])
	}
	return id, nil
}

// findEntry returns the fields of the first line of the colon-separated
// file rel (inside rootfs, symlinks read as the guest would) that match
// wants. A missing file has no entries.
func findEntry(rootfs, rel string, match func(fields []string) bool) ([]string, bool, error) {
	root, err := fstree.Open(rootfs)
	if err != nil {
		return nil, false, err
	}
	defer root.Close()
	p, err := root.Resolve(rel)
	if err != nil {
		return nil, false, err
	}
	f, err := root.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Split(line, ":"); match(fields) {
			return fields, true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fmt.Errorf("/%s: %w", rel, err)
	}
	return nil, false, nil
}
