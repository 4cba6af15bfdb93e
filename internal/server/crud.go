package server

import (
	"context"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// The read paths are the same for every kind; only the collection
// differs.

func get[T store.Object](ctx context.Context, c store.Collection[T], req *torporv1.GetRequest, needSpace bool) (T, error) {
	var zero T
	if err := keyOf(req.GetSpace(), req.GetName(), needSpace); err != nil {
		return zero, err
	}
	obj, err := c.Get(ctx, req.GetSpace(), req.GetName())
	if err != nil {
		return zero, err
	}
	return obj, nil
}

func list[T store.Object](ctx context.Context, c store.Collection[T], req *torporv1.ListRequest) ([]T, string, error) {
	if req.GetSpace() != "" {
		if err := validate.Name("space", req.GetSpace()); err != nil {
			return nil, "", err
		}
	}
	if req.GetPageSize() < 0 || req.GetPageSize() > store.MaxPageSize {
		return nil, "", invalidArgument("pageSize", "%d is outside 0..%d", req.GetPageSize(), store.MaxPageSize)
	}
	items, next, err := c.List(ctx, store.ListOptions{Space: req.GetSpace(), PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, "", err
	}
	return items, next, nil
}

func keyOf(space, name string, needSpace bool) error {
	if needSpace {
		if err := validate.Name("space", space); err != nil {
			return err
		}
	}
	return validate.Name("name", name)
}
