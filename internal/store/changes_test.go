package store_test

import (
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// The actors' history reads back in order, with each actor as it is now
// (nil once deleted), on both backends.
func TestActorChanges(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx, st := fresh(t, b)
			if seq, err := st.LatestChange(ctx); err != nil || seq != 0 {
				t.Fatalf("latest change of an empty store: %d, %v", seq, err)
			}
			a, err := st.Actors().Create(ctx, newActor("default", "a"))
			if err != nil {
				t.Fatal(err)
			}
			gone, err := st.Actors().Create(ctx, newActor("default", "gone"))
			if err != nil {
				t.Fatal(err)
			}
			for _, uid := range []string{a.GetMetadata().GetUid(), gone.GetMetadata().GetUid(), a.GetMetadata().GetUid()} {
				if err := st.AppendEvent(ctx, store.Event{ActorUID: uid, ToState: torporv1.ActorState_ACTOR_STATE_RUNNING}); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Actors().Delete(ctx, "default", "gone", "", 0); err != nil {
				t.Fatal(err)
			}
			all, err := st.ActorChanges(ctx, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 3 {
				t.Fatalf("%d changes, want 3: %+v", len(all), all)
			}
			for i, c := range all {
				if i > 0 && c.Seq <= all[i-1].Seq {
					t.Errorf("change %d: seq %d after %d", i, c.Seq, all[i-1].Seq)
				}
			}
			if all[0].Actor.GetMetadata().GetName() != "a" || all[2].Actor.GetMetadata().GetName() != "a" || all[1].Actor != nil {
				t.Errorf("changes carry %v, %v, %v; want a, nil (deleted), a", all[0].Actor.GetMetadata(), all[1].Actor, all[2].Actor.GetMetadata())
			}
			latest, err := st.LatestChange(ctx)
			if err != nil || latest != all[2].Seq {
				t.Errorf("latest change %d, %v; want %d", latest, err, all[2].Seq)
			}
			after, err := st.ActorChanges(ctx, all[0].Seq, 1)
			if err != nil || len(after) != 1 || after[0].Seq != all[1].Seq {
				t.Errorf("one change after the first: %+v, %v; want seq %d", after, err, all[1].Seq)
			}
		})
	}
}
