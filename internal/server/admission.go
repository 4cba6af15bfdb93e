package server

import (
	"context"
	"fmt"
	"slices"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// admit checks a template before anything of it is stored: its form and
// limits, that its images come from where the installation allows (the
// server reads nothing else), that its sandbox class is one the
// installation offers, and that each container has something to run.
// Every refusal is InvalidArgument naming the field.
func (s *templateService) admit(ctx context.Context, t *torporv1.Template) error {
	if err := validate.Template(t, image.IsPinned); err != nil {
		return err
	}
	if err := validate.Images(t, s.images.Check); err != nil {
		return err
	}
	classes, err := offeredClasses(ctx, s.store)
	if err != nil {
		return err
	}
	if err := validate.SandboxClass(t, classes); err != nil {
		return err
	}
	return validate.Commands(ctx, t, s.images.Config)
}

// offeredClasses are the sandbox classes templates may name: the default
// one and those of every registered node.
func offeredClasses(ctx context.Context, st store.Store) ([]string, error) {
	classes := []string{validate.DefaultSandboxClass}
	for n, err := range store.All(ctx, st.Nodes(), store.ListOptions{}) {
		if err != nil {
			return nil, fmt.Errorf("list nodes for their sandbox classes: %w", err)
		}
		for _, c := range n.GetSandboxClasses() {
			if !slices.Contains(classes, c) {
				classes = append(classes, c)
			}
		}
	}
	slices.Sort(classes)
	return classes, nil
}
