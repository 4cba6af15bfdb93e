package workflow

import (
	"context"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// resumeReads are what a resume's claim reads besides the actor, read
// together in one round trip (store.Reads): the template revision, the
// nodes' heartbeats, the free workers and every snapshot the resume may
// restore. They are read from the store, never a cache (invariant 4).
type resumeReads struct {
	tmpl  *store.Read[*torporv1.Template]
	nodes *store.Read[*torporv1.Node]
	free  *store.Read[*torporv1.Worker]
	snaps map[string]*store.Read[*torporv1.Snapshot]
}

func (e *Engine) readForResume(ctx context.Context, a *torporv1.Actor, opts ResumeOptions, revision string) (*resumeReads, error) {
	rs := &store.Reads{}
	space, st := a.GetMetadata().GetSpace(), a.GetStatus()
	r := &resumeReads{
		tmpl:  store.ReadGet(rs, e.store.Revisions(), space, revision),
		nodes: store.ReadAll(rs, e.store.Nodes(), store.ListOptions{}),
		free:  store.ReadAll(rs, e.store.Workers(), freeWorkerList),
		snaps: map[string]*store.Read[*torporv1.Snapshot]{},
	}
	// The snapshots resumeSource may ask for.
	for _, name := range []string{opts.Snapshot, st.GetLocalCheckpoint(), st.GetLatestSnapshot()} {
		if name != "" && r.snaps[name] == nil {
			r.snaps[name] = store.ReadGet(rs, e.store.Snapshots(), space, name)
		}
	}
	return r, rs.Run(ctx)
}

// snapshot is the record of one of the snapshots read, ErrNotFound when
// it has none.
func (r *resumeReads) snapshot(name string) (*torporv1.Snapshot, error) {
	return r.snaps[name].Record()
}
