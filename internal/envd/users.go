package envd

import (
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// identity is who a call runs as.
type identity struct {
	name     string
	uid, gid uint32
	groups   []uint32
	// home is the user's home directory, empty when it does not exist.
	home string
	// switched: the call runs as another user than the daemon's.
	switched bool
}

// users resolves the names calls give (see the package comment).
type users struct {
	self identity
}

func newUsers() *users {
	self := identity{uid: uint32(os.Getuid()), gid: uint32(os.Getgid())}
	if u, err := user.LookupId(strconv.Itoa(os.Getuid())); err == nil {
		self.name = u.Username
		self.home = existingDir(u.HomeDir)
	}
	if h := existingDir(os.Getenv("HOME")); h != "" {
		self.home = h
	}
	return &users{self: self}
}

// lookup finds who a call naming name runs as: that user when it exists
// and the daemon can become it, else the daemon's own user. No name is
// DefaultUser.
func (u *users) lookup(name string) identity {
	if name == "" {
		name = DefaultUser
	}
	if name == u.self.name {
		return u.self
	}
	usr, err := user.Lookup(name)
	if err != nil {
		return u.self
	}
	uid, err1 := strconv.ParseUint(usr.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(usr.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return u.self
	}
	if uint32(uid) == u.self.uid {
		id := u.self
		id.name = usr.Username
		if h := existingDir(usr.HomeDir); h != "" {
			id.home = h
		}
		return id
	}
	if u.self.uid != 0 {
		return u.self // only root may become another user
	}
	id := identity{name: usr.Username, uid: uint32(uid), gid: uint32(gid), home: existingDir(usr.HomeDir), switched: true}
	if gids, err := usr.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				id.groups = append(id.groups, uint32(n))
			}
		}
	}
	return id
}

func existingDir(p string) string {
	if p == "" {
		return ""
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return p
	}
	return ""
}

// dir is where the user's relative paths start: its home, else "/".
func (id identity) dir() string {
	if id.home != "" {
		return id.home
	}
	return "/"
}

// abs makes p absolute for the user: "~" is its home, a relative path
// starts at dir.
func (id identity) abs(p string) string {
	switch {
	case p == "~":
		return id.dir()
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(id.dir(), p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	}
	return filepath.Join(id.dir(), p)
}

// credential is what a process of the user runs with; nil for the
// daemon's own user.
func (id identity) credential() *syscall.Credential {
	if !id.switched {
		return nil
	}
	return &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
}

// own gives path to the user, when the daemon made it as root for
// another user.
func (id identity) own(path string) error {
	if !id.switched {
		return nil
	}
	return os.Lchown(path, int(id.uid), int(id.gid))
}

// environ is a process's environment for the user: the daemon's own (the
// container's), the user's HOME, USER and LOGNAME, the sandbox's env,
// then the call's; later ones win.
func (id identity) environ(sandbox, call map[string]string) []string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if _, ok := env["PATH"]; !ok {
		env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	env["HOME"] = id.dir()
	if id.name != "" {
		env["USER"], env["LOGNAME"] = id.name, id.name
	}
	maps.Copy(env, sandbox)
	maps.Copy(env, call)
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
