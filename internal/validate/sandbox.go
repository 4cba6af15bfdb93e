package validate

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxSandboxIDLen keeps "<port>-<id>" (a port of up to 5 digits) within
// one 63-character DNS label, the form routers take sandbox hosts in.
const MaxSandboxIDLen = maxNameLen - len("65535-")

var sandboxID = regexp.MustCompile(`^[a-z0-9]+$`)

// SandboxID checks an E2B sandbox ID: lower-case letters and digits, short
// enough that "<port>-<id>" is one DNS label. Every such ID is also an
// actor name (the actor of a sandbox is named by its ID).
func SandboxID(path, id string) error {
	switch {
	case id == "":
		return fieldErr(path, "required")
	case len(id) > MaxSandboxIDLen:
		return fieldErr(path, "%q is longer than %d characters", id, MaxSandboxIDLen)
	case !sandboxID.MatchString(id):
		return fieldErr(path, "%q is not a sandbox ID (lower-case letters and digits only)", id)
	}
	return nil
}

// Env checks an E2B sandbox's environment (ActorSpec.env) by the rules
// of a container's: names without '=' or NUL, values without NUL, within
// the same limits.
func Env(path string, env map[string]string) error {
	if len(env) > maxEnv {
		return fieldErr(path, "%d variables, more than %d", len(env), maxEnv)
	}
	size := 0
	for name, value := range env {
		p := fmt.Sprintf("%s[%q]", path, name)
		switch {
		case name == "":
			return fieldErr(path, "a variable has no name")
		case len(name) > maxEnvNameLen:
			return fieldErr(p, "name longer than %d bytes", maxEnvNameLen)
		case strings.ContainsAny(name, "=\x00"):
			return fieldErr(p, "a variable's name holds no '=' and no NUL")
		case strings.ContainsRune(value, 0):
			return fieldErr(p, "the value holds a NUL byte")
		}
		size += len(name) + len(value)
	}
	if size > maxEnvBytes {
		return fieldErr(path, "names and values hold %d bytes, more than %d", size, maxEnvBytes)
	}
	return nil
}
