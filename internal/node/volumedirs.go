package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// volumeDirs are the actors' durable volumes on this node: a directory
// per actor under root, filled at a start (prepareVolumes) and archived
// into its snapshots (archiveVolumes).
type volumeDirs struct {
	root string
	log  *slog.Logger
}

// dir is actorUID's directory, holding a directory per volume.
func (v volumeDirs) dir(actorUID string) string { return filepath.Join(v.root, actorUID) }

// remove deletes actorUID's volumes; the caller made sure no slot hosts
// the actor.
func (v volumeDirs) remove(actorUID string) error {
	if err := os.RemoveAll(v.dir(actorUID)); err != nil {
		return fmt.Errorf("remove volumes of actor %s: %w", actorUID, err)
	}
	return nil
}

// removeStrays deletes the volumes of actors hosted does not name: an
// operation that crashed before recording left them.
func (v volumeDirs) removeStrays(hosted map[string]bool) error {
	entries, err := os.ReadDir(v.root)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if hosted[e.Name()] {
			continue
		}
		v.log.Info("removing volumes of an actor no worker hosts", "actor_uid", e.Name())
		errs = append(errs, os.RemoveAll(filepath.Join(v.root, e.Name())))
	}
	return errors.Join(errs...)
}
