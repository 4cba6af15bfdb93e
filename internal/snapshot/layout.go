package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

const (
	manifestName = "manifest.json"
	digestAlgo   = "sha256:"
	segmentsLen  = 3
)

// Location is where one snapshot lives in the object store:
// <space>/<actor uid>/<snapshot uid>.
func Location(space, actorUID, snapshotUID string) (string, error) {
	for _, f := range []struct{ name, value string }{
		{"space", space}, {"actor uid", actorUID}, {"snapshot uid", snapshotUID},
	} {
		if strings.Contains(f.value, "/") {
			return "", fmt.Errorf("snapshot location: %s %q: %w: contains '/'", f.name, f.value, ErrInvalidKey)
		}
		if err := ValidateKey(f.value); err != nil {
			return "", fmt.Errorf("snapshot location: %s: %w", f.name, err)
		}
	}
	return space + "/" + actorUID + "/" + snapshotUID, nil
}

// ParseLocation splits a location made by Location.
func ParseLocation(location string) (space, actorUID, snapshotUID string, err error) {
	if err := ValidateKey(location); err != nil {
		return "", "", "", fmt.Errorf("snapshot location: %w", err)
	}
	parts := strings.Split(location, "/")
	if len(parts) != segmentsLen {
		return "", "", "", fmt.Errorf("snapshot location %q: %w: want <space>/<actor uid>/<snapshot uid>", location, ErrInvalidKey)
	}
	return parts[0], parts[1], parts[2], nil
}

// locationPrefix turns a location prefix of whole segments ("", a space,
// or space/actor uid) into a key prefix that cannot match a longer name
// ("a" must not match "ab/...").
func locationPrefix(prefix string) (string, error) {
	if prefix == "" {
		return "", nil
	}
	if err := ValidateKey(prefix); err != nil {
		return "", fmt.Errorf("snapshot location prefix: %w", err)
	}
	if n := strings.Count(prefix, "/") + 1; n > segmentsLen {
		return "", fmt.Errorf("snapshot location prefix %q: %w: more than %d segments", prefix, ErrInvalidKey, segmentsLen)
	}
	return prefix + "/", nil
}

func manifestKey(location string) string { return location + "/" + manifestName }

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return digestAlgo + hex.EncodeToString(sum[:])
}

func validateDigest(d string) error {
	hexPart, ok := strings.CutPrefix(d, digestAlgo)
	if !ok || len(hexPart) != sha256.Size*2 {
		return fmt.Errorf("manifest digest %q: want %s<64 hex digits>", d, digestAlgo)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return fmt.Errorf("manifest digest %q: %w", d, err)
	}
	return nil
}
