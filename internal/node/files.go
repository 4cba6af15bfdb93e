package node

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/torpor-dev/torpor/internal/atomicfile"
)

// writeJSON replaces path with v's JSON (mode 0600) so that after a crash
// the file holds either the old record or the new one, never a mix.
func writeJSON(path string, v any) error {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return atomicfile.Write(path, body, 0o600)
}

// readJSON decodes path into v; a missing file is reported as os.ErrNotExist.
func readJSON(path string, v any) error {
	body, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
