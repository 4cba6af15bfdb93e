package validate

import "regexp"

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
