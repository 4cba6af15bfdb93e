package workflow

import (
	"context"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// resumeReads are what a resume reads before it claims, together in one
// round trip (store.Reads): the actor, and, selected by what the actor's
// record holds without reading it first, its template revision and its
// snapshots; the nodes' heartbeats; the free workers. They are read from
// the store, never a cache (invariant 4).
type resumeReads struct {
	space string
	actor *store.Read[*torporv1.Actor]
	tmpl  *store.Read[*torporv1.Template]
	nodes *store.Read[*torporv1.Node]
	free  *store.Read[*torporv1.Worker]
	// snaps are the actor's snapshots (by its uid); asked is the one the
	// request names (askedName), which may be another actor's.
	snaps, asked *store.Read[*torporv1.Snapshot]
	askedName    string
	// get reads a snapshot the reads did not find (see snapshot).
	get func(name string) (*torporv1.Snapshot, error)
}

func (e *Engine) readForResume(ctx context.Context, space, name string, opts ResumeOptions) (*resumeReads, error) {
	rs := &store.Reads{}
	inSpace := store.ListOptions{Space: space}
	r := &resumeReads{
		space: space,
		actor: store.ReadGet(rs, e.store.Actors(), space, name),
		// An actor's "template" column is the name of the revision it
		// resumes under.
		tmpl:  store.ReadAllIn(rs, e.store.Revisions(), inSpace, "name", store.ValuesOf(e.store.Actors(), "template", space, name)),
		nodes: store.ReadAll(rs, e.store.Nodes(), store.ListOptions{}),
		free:  store.ReadAll(rs, e.store.Workers(), freeWorkerList),
		snaps: store.ReadAllIn(rs, e.store.Snapshots(), inSpace, "actor_uid", store.ValuesOf(e.store.Actors(), "uid", space, name)),
		get: func(name string) (*torporv1.Snapshot, error) {
			return e.store.Snapshots().Get(ctx, space, name)
		},
	}
	if opts.Snapshot != "" {
		r.asked, r.askedName = store.ReadGet(rs, e.store.Snapshots(), space, opts.Snapshot), opts.Snapshot
	}
	return r, rs.Run(ctx)
}

// template is the record of the revision a resumes under, ErrNotFound
// when there is none.
func (r *resumeReads) template(revision string) (*torporv1.Template, error) {
	tmpls, err := r.tmpl.Records()
	if err != nil {
		return nil, err
	}
	for _, t := range tmpls {
		if t.GetMetadata().GetName() == revision {
			return t, nil
		}
	}
	return nil, fmt.Errorf("template revision %s/%s: %w", r.space, revision, store.ErrNotFound)
}

// snapshot is the record of one of the snapshots a resume may restore,
// ErrNotFound when it has none. One the reads did not find (a latest
// snapshot recorded under another actor uid) is read on its own.
func (r *resumeReads) snapshot(name string) (*torporv1.Snapshot, error) {
	if r.asked != nil && name == r.askedName {
		return r.asked.Record()
	}
	snaps, err := r.snaps.Records()
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		if s.GetMetadata().GetName() == name {
			return s, nil
		}
	}
	return r.get(name)
}
