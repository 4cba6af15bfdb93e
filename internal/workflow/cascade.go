package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor-dev/torpor/internal/store"
)

// EmptySpace deletes what space holds, for the space to be deleted
// (`space delete --cascade`): every actor (with force: running ones are
// stopped without a snapshot), then every snapshot tag (their snapshots
// go with them, their actors being gone), then every template with its
// revisions and golden snapshots. Each actor's delete commits its own
// intent and is recovered on its own; an emptying cut short is finished
// by asking again.
func (e *Engine) EmptySpace(ctx context.Context, space string) error {
	actors, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Space: space})
	if err != nil {
		return fmt.Errorf("empty space %s: actors: %w", space, err)
	}
	for _, a := range actors {
		if err := e.Delete(ctx, space, a.GetMetadata().GetName(), DeleteOptions{Force: true}); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("empty space %s: %w", space, err)
		}
	}
	tags, err := store.ListAll(ctx, e.store.Tags(), store.ListOptions{Space: space})
	if err != nil {
		return fmt.Errorf("empty space %s: snapshot tags: %w", space, err)
	}
	for _, t := range tags {
		if err := e.Untag(ctx, space, t.GetMetadata().GetName(), "", 0); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("empty space %s: untag %s: %w", space, t.GetMetadata().GetName(), err)
		}
	}
	templates, err := store.ListAll(ctx, e.store.Templates(), store.ListOptions{Space: space})
	if err != nil {
		return fmt.Errorf("empty space %s: templates: %w", space, err)
	}
	for _, t := range templates {
		if err := e.DeleteTemplate(ctx, space, t.GetMetadata().GetName(), 0, "", 0); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("empty space %s: %w", space, err)
		}
	}
	return nil
}
