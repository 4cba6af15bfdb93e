package store

import (
	"context"
	"iter"
)

// All yields every record c lists with opts, following page tokens,
// MaxPageSize records a page. A failed read yields its error and ends the
// sequence. A caller may write the records it is given: the next page
// starts after the last (space, name) read, not at an offset.
func All[T Object](ctx context.Context, c Collection[T], opts ListOptions) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		opts.PageSize = MaxPageSize
		for {
			page, next, err := c.List(ctx, opts)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, obj := range page {
				if !yield(obj, nil) {
					return
				}
			}
			if next == "" {
				return
			}
			opts.PageToken = next
		}
	}
}

// ListAll is every record c lists with opts.
func ListAll[T Object](ctx context.Context, c Collection[T], opts ListOptions) ([]T, error) {
	var all []T
	for obj, err := range All(ctx, c, opts) {
		if err != nil {
			return nil, err
		}
		all = append(all, obj)
	}
	return all, nil
}

// PageTokenAfter is the page token of a list that goes on after record
// (space, name): for a caller that pages through a list it filters
// itself, whose pages end between the store's.
func PageTokenAfter(space, name string) string { return encodePageToken(space, name) }
