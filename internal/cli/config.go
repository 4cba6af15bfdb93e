package cli

import (
	"fmt"
	"os"
	"path/filepath"
)

// DataDir is $XDG_DATA_HOME/torpor, or ~/.local/share/torpor when
// XDG_DATA_HOME is unset. It is where the single-machine defaults (SQLite
// database, local snapshots) live. It is not created here.
func DataDir() (string, error) {
	if dir := os.Getenv("XDG_DATA_HOME"); dir != "" {
		return filepath.Join(dir, "torpor"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locate data directory: %w", err)
	}
	return filepath.Join(home, ".local", "share", "torpor"), nil
}
