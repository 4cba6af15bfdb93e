package store_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// BenchmarkStore measures the writes on the resume path, per backend.
func BenchmarkStore(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			ctx := context.Background()
			s := openStore(b, ctx, be.freshURL(b))
			// Every run of a sub-benchmark writes under its own names.
			runs := 0
			prefix := func() string { runs++; return fmt.Sprintf("run%d", runs) }

			b.Run("create-actor", func(b *testing.B) {
				space := prefix()
				for i := 0; i < b.N; i++ {
					if _, err := s.Actors().Create(ctx, newActor(space, fmt.Sprintf("a%d", i))); err != nil {
						b.Fatal(err)
					}
				}
			})

			b.Run("cas-update-actor", func(b *testing.B) {
				a, err := s.Actors().Create(ctx, newActor(prefix(), "a"))
				if err != nil {
					b.Fatal(err)
				}
				states := []torporv1.ActorState{torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_RUNNING}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					a.Status.State = states[i%2]
					if a, err = s.Actors().Update(ctx, a); err != nil {
						b.Fatal(err)
					}
				}
			})

			// One resume's placement: find a free worker, point actor and
			// worker at each other, in one transaction.
			b.Run("claim-worker", func(b *testing.B) {
				space := prefix()
				err := s.InTx(ctx, func(tx store.Tx) error {
					for i := 0; i < b.N; i++ {
						if _, err := tx.Actors().Create(ctx, newActor(space, fmt.Sprintf("a%d", i))); err != nil {
							return err
						}
						if _, err := tx.Workers().Create(ctx, newWorker(space, fmt.Sprintf("w%d", i), "node-1", "default")); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				free := store.ListOptions{Space: space, PageSize: 1, Filter: store.Filter{"actor": ""}}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					err := s.InTx(ctx, func(tx store.Tx) error {
						workers, _, err := tx.Workers().List(ctx, free)
						if err != nil || len(workers) == 0 {
							return fmt.Errorf("no free worker (%d claimed): %v", i, err)
						}
						a, err := tx.Actors().Get(ctx, space, fmt.Sprintf("a%d", i))
						if err != nil {
							return err
						}
						return claim(ctx, tx, a, proto.CloneOf(workers[0]))
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
