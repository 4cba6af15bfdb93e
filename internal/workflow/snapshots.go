package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// The snapshot lifecycle: whether a snapshot's record or its files may
// go, answered in one place. Deletion is the one operation that can lose
// user state, so every path that deletes a snapshot record or its files
// (retention after a checkpoint, a revert, an actor's delete, an untag, a
// user's DeleteSnapshot, a failed resume's spoilt local checkpoint, a
// resume consuming its local checkpoint, a template's delete, a forced
// delete's interrupted checkpoint, the server's orphan sweep) asks
// referencesOf, and only this file calls the store's snapshot delete or
// snapshot storage's (internal/arch checks it). As in Nomad's core
// scheduler or containerd's metadata GC: one reference rule, many
// collectors.
//
// A path decides on the records as read and deletes a record by
// compare-and-set on the version it read; whoever tags or forks a
// snapshot bumps that version in its own transaction (tags.go, fork.go).
// So a reference committed after the decision makes the delete fail and
// the snapshot stay, on either backend; files go only once their record
// is gone and no other record names their location.

// references are what keep a snapshot.
type references struct {
	// holder says why the record must stay ("" when it may go): it is
	// the current state of its actor (the actor's latest snapshot or
	// local checkpoint), a tag names it, or it is the golden snapshot of
	// a template revision.
	holder string
	// filesKept: another record (a fork's, or its source's) names its
	// location, or the location is not one this system lays out, and so
	// not ours to judge. Its files stay.
	filesKept bool
}

// refSource is what referencesOf reads: the store, or the transaction
// the deletion commits in, as the deleting step leaves it.
type refSource struct {
	tx store.Tx
	// after, when set, is the snapshot's actor as the deleting step
	// leaves it, where that is not what tx reads (the step writes it
	// later in its transaction, or commits after deciding): a step that
	// moves its actor off a snapshot may delete it.
	after *torporv1.Actor
	// ahead, when set, replaces tx for records and tags: what a step
	// read before its transaction (retention, readForCheckpointEnd).
	ahead *readAhead
}

// readAhead are the records naming some locations and the tags naming
// some snapshots, read in one round trip before a transaction.
type readAhead struct {
	records []*torporv1.Snapshot
	tags    []*torporv1.SnapshotTag
}

// errNotReadAhead answers a question the read-ahead records cannot: the
// snapshot is kept.
var errNotReadAhead = errors.New("not read ahead")

// referencesOf is the one answer to "may this snapshot's record or files
// go?" for s, a snapshot record or, for the orphan sweep, a bare location
// (a snapshot with no name). It is the union of what every deletion path
// protected before it existed.
func referencesOf(ctx context.Context, src refSource, s *torporv1.Snapshot) (references, error) {
	var refs references
	m := s.GetMetadata()
	if m.GetName() != "" {
		holder, err := src.holder(ctx, s)
		if err != nil {
			return references{}, fmt.Errorf("references of snapshot %s/%s: %w", m.GetSpace(), m.GetName(), err)
		}
		refs.holder = holder
	}
	if _, _, _, err := snapshot.ParseLocation(s.GetLocation()); err != nil {
		refs.filesKept = true
		return refs, nil
	}
	others, err := src.recordsAt(ctx, s.GetLocation())
	if err != nil {
		return references{}, fmt.Errorf("records of snapshot location %s: %w", s.GetLocation(), err)
	}
	for _, o := range others {
		if m.GetUid() == "" || o.GetMetadata().GetUid() != m.GetUid() {
			refs.filesKept = true
		}
	}
	return refs, nil
}

// holder is why the record s must stay, "" when nothing holds it.
func (src refSource) holder(ctx context.Context, s *torporv1.Snapshot) (string, error) {
	m := s.GetMetadata()
	switch {
	case s.GetActorName() != "":
		a, err := src.actor(ctx, m.GetSpace(), s.GetActorName())
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return "", err
		case a.GetMetadata().GetUid() == s.GetActorUid() &&
			(a.GetStatus().GetLatestSnapshot() == m.GetName() || a.GetStatus().GetLocalCheckpoint() == m.GetName()):
			return "the current state of actor " + a.GetMetadata().GetName(), nil
		}
	case s.GetTemplateName() != "":
		// A template's golden snapshot: its revision names it.
		rev, err := src.revision(ctx, m.GetSpace(), s.GetTemplateName())
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return "", err
		case rev.GetMetadata().GetUid() == s.GetTemplateUid() && rev.GetStatus().GetGoldenSnapshot() == m.GetName():
			return "the golden snapshot of template " + rev.GetMetadata().GetName() + ": delete the template", nil
		}
	}
	tag, err := src.tag(ctx, m.GetSpace(), m.GetName())
	if err != nil || tag == "" {
		return "", err
	}
	return "tagged " + tag + ": untag it first", nil
}

func (src refSource) actor(ctx context.Context, space, name string) (*torporv1.Actor, error) {
	if a := src.after; a != nil && a.GetMetadata().GetSpace() == space && a.GetMetadata().GetName() == name {
		return a, nil
	}
	if src.ahead != nil {
		return nil, errNotReadAhead
	}
	return src.tx.Actors().Get(ctx, space, name)
}

func (src refSource) revision(ctx context.Context, space, name string) (*torporv1.Template, error) {
	if src.ahead != nil {
		return nil, errNotReadAhead
	}
	return src.tx.Revisions().Get(ctx, space, name)
}

// tag is the name of a tag naming snapshot, "" when none does.
func (src refSource) tag(ctx context.Context, space, snapshot string) (string, error) {
	tags := []*torporv1.SnapshotTag(nil)
	if src.ahead != nil {
		tags = src.ahead.tags
	} else {
		var err error
		if tags, _, err = src.tx.Tags().List(ctx, store.ListOptions{Space: space, PageSize: 1, Filter: store.Filter{"snapshot": snapshot}}); err != nil {
			return "", fmt.Errorf("tags of snapshot %s/%s: %w", space, snapshot, err)
		}
	}
	for _, t := range tags {
		if t.GetMetadata().GetSpace() == space && t.GetSnapshot() == snapshot {
			return t.GetMetadata().GetName(), nil
		}
	}
	return "", nil
}

// recordsAt are records naming location: all of them, or two at least
// when there are more (enough to tell another from the one asked about).
func (src refSource) recordsAt(ctx context.Context, location string) ([]*torporv1.Snapshot, error) {
	if src.ahead == nil {
		recs, _, err := src.tx.Snapshots().List(ctx, store.ListOptions{PageSize: 2, Filter: store.Filter{"location": location}})
		return recs, err
	}
	var out []*torporv1.Snapshot
	for _, r := range src.ahead.records {
		if r.GetLocation() == location {
			out = append(out, r)
		}
	}
	return out, nil
}

// LocationReferenced reports whether the files at a snapshot location
// must stay: the orphan sweep's question, answered by referencesOf.
func (e *Engine) LocationReferenced(ctx context.Context, location string) (bool, error) {
	refs, err := referencesOf(ctx, refSource{tx: e.store}, &torporv1.Snapshot{Location: location})
	return refs.filesKept, err
}

// DeleteSnapshot deletes the record of snapshot space/name (uid and
// version, when set, must match) unless something holds it: an actor
// whose current state it is (the state would be lost, invariant 5), a
// tag, a template whose golden snapshot it is. It deletes the record as
// read, so a tag or fork committed meanwhile makes it fail. The files go
// with the orphan sweep, once no record (a fork's included) names them.
func (e *Engine) DeleteSnapshot(ctx context.Context, space, name, uid string, version int64) error {
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		snap, err := tx.Snapshots().Get(ctx, space, name)
		if err != nil {
			return err
		}
		if (uid != "" && uid != snap.GetMetadata().GetUid()) || (version != 0 && version != snap.GetMetadata().GetVersion()) {
			return errdefs.Errorf(errdefs.ErrAborted, "snapshot %s/%s does not match the given uid or version", space, name)
		}
		holder, err := deleteUnheldInTx(ctx, tx, nil, snap)
		if err == nil && holder != "" {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "snapshot %s/%s is %s", space, name, holder)
		}
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return errdefs.Errorf(errdefs.ErrAborted, "snapshot %s/%s changed while deleting it: retry", space, name)
	}
	return err
}

// unheld are the snapshots of snaps that nothing holds, as src reads
// them.
func unheld(ctx context.Context, src refSource, snaps []*torporv1.Snapshot) ([]*torporv1.Snapshot, error) {
	var out []*torporv1.Snapshot
	for _, s := range snaps {
		refs, err := referencesOf(ctx, src, s)
		if err != nil {
			return nil, err
		}
		if refs.holder == "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// expireInTx deletes the records of snapshots unheld decided may go,
// compare-and-setting the versions read, within the transaction that
// moves their actor off them, and returns those it deleted: their files
// are removed after the commit (removeSnapshotFiles), so nothing ever
// points at files that are going away.
func expireInTx(ctx context.Context, tx store.Tx, expire []*torporv1.Snapshot) ([]*torporv1.Snapshot, error) {
	var expired []*torporv1.Snapshot
	for _, s := range expire {
		m := s.GetMetadata()
		err := tx.Snapshots().Delete(ctx, m.GetSpace(), m.GetName(), m.GetUid(), m.GetVersion())
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue // removed meanwhile, with its files
		case errors.Is(err, store.ErrConflict):
			continue // tagged or forked since it was read: the next retention decides again
		case err != nil:
			return nil, err
		}
		expired = append(expired, s)
	}
	return expired, nil
}

// deleteUnheldInTx deletes the record s as read (ErrConflict when it
// changed since: a tag or fork bumps its version) unless something holds
// it once the step leaves its actor as after (nil: as tx reads it), and
// returns what holds it, "" when it deleted the record.
func deleteUnheldInTx(ctx context.Context, tx store.Tx, after *torporv1.Actor, s *torporv1.Snapshot) (string, error) {
	refs, err := referencesOf(ctx, refSource{tx: tx, after: after}, s)
	if err != nil || refs.holder != "" {
		return refs.holder, err
	}
	m := s.GetMetadata()
	if err := tx.Snapshots().Delete(ctx, m.GetSpace(), m.GetName(), m.GetUid(), m.GetVersion()); err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	return "", nil
}

// deleteLetGoInTx deletes within tx the record space/name that the step
// let go of, leaving its actor as after (nil for a template's golden
// snapshot whose revision tx deleted), and returns it for its files to be
// removed once tx commits: nil when it is gone already or something else
// holds it.
func deleteLetGoInTx(ctx context.Context, tx store.Tx, after *torporv1.Actor, space, name string) (*torporv1.Snapshot, error) {
	s, err := tx.Snapshots().Get(ctx, space, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if holder, err := deleteUnheldInTx(ctx, tx, after, s); err != nil || holder != "" {
		return nil, err
	}
	return s, nil
}

// lettingGo is actor a as its delete leaves it: holding no snapshot.
func lettingGo(a *torporv1.Actor) *torporv1.Actor {
	gone := proto.CloneOf(a)
	gone.Status.LatestSnapshot, gone.Status.LocalCheckpoint = "", ""
	return gone
}

// removeSnapshot deletes a snapshot's record as it was read (a tag or
// fork since makes it fail with ErrConflict), unless something holds it
// once the step leaves its actor as after, then its files.
func (e *Engine) removeSnapshot(ctx context.Context, after *torporv1.Actor, s *torporv1.Snapshot) error {
	if holder, err := deleteUnheldInTx(ctx, e.store, after, s); err != nil || holder != "" {
		return err
	}
	return e.removeSnapshotFiles(ctx, s)
}

// removeSnapshotFiles removes the files of a snapshot whose record is
// gone (or never was: an interrupted checkpoint's), unless referencesOf
// keeps them: from snapshot storage, or from the node that holds a local
// checkpoint.
func (e *Engine) removeSnapshotFiles(ctx context.Context, s *torporv1.Snapshot) error {
	if s.GetNode() == "" && e.objects == nil {
		return nil
	}
	if refs, err := referencesOf(ctx, refSource{tx: e.store}, s); err != nil || refs.filesKept {
		return err
	}
	if s.GetNode() != "" {
		e.dropCheckpoint(ctx, s)
		return nil
	}
	return e.objects.DeleteSnapshot(ctx, s.GetLocation())
}

// dropCheckpointTimeout bounds a node's removal of a local checkpoint,
// which nobody waits for.
const dropCheckpointTimeout = 10 * time.Second

// dropCheckpoint asks the node holding the local checkpoint s to remove
// its files. Best effort: the record is gone already, so a failure is
// only logged. A node that is down at that moment keeps the files until a
// node-side sweep of unrecorded checkpoints exists, or the actor starts
// on it again.
func (e *Engine) dropCheckpoint(ctx context.Context, s *torporv1.Snapshot) {
	ctx, cancel := context.WithTimeout(ctx, dropCheckpointTimeout)
	defer cancel()
	agent, err := e.agents.Agent(ctx, s.GetNode())
	if err == nil {
		_, err = agent.DropCheckpoint(ctx, connect.NewRequest(&torporv1.DropCheckpointRequest{Location: s.GetLocation()}))
	}
	if err != nil {
		e.log.Warn("local checkpoint files left on their node", "space", s.GetMetadata().GetSpace(), "actor_uid", s.GetActorUid(),
			"snapshot", s.GetMetadata().GetName(), "node", s.GetNode(), "location", s.GetLocation(), "err", err)
	}
}

// retention is what the end of a checkpoint to storage expires.
type retention struct {
	// expire are the snapshot records to delete in the end's transaction.
	expire []*torporv1.Snapshot
	// refs reads what was read before the end's transaction: the
	// records naming the locations of the actor's snapshots (theirs
	// included) and the tags naming them, with the actor as the end
	// commits it.
	refs refSource
}

// expiring applies retention to the actor's durable snapshots once
// latest is committed as its newest: it keeps the newest K (its template's
// keep) and expires the older ones that nothing holds. An actor's
// snapshots are only created by its checkpoints, one at a time, so the
// records read before the finalize's transaction are those at its commit;
// a tag or fork made since bumps a snapshot's version, which expireInTx
// compare-and-sets.
func (e *Engine) expiring(ctx context.Context, a *torporv1.Actor, sharing *store.Read[*torporv1.Snapshot], tags *store.Read[*torporv1.SnapshotTag], latest *torporv1.Snapshot) (retention, error) {
	recs, err := sharing.Records()
	if err != nil {
		return retention{}, err
	}
	tagged, err := tags.Records()
	if err != nil {
		return retention{}, err
	}
	keep := int(a.GetStatus().GetCurrentTemplateSpec().GetSnapshotPolicy().GetKeep())
	if keep <= 0 {
		keep = 2
	}
	m := a.GetMetadata()
	var durable []*torporv1.Snapshot
	for _, s := range recs {
		if s.GetMetadata().GetSpace() == m.GetSpace() && s.GetActorUid() == m.GetUid() && s.GetNode() == "" && s.GetMetadata().GetName() != latest.GetMetadata().GetName() {
			durable = append(durable, s)
		}
	}
	// The actor as the end commits it: at latest, which sorts last (names
	// sort by creation time) and is kept.
	after := proto.CloneOf(a)
	after.Status.LatestSnapshot = latest.GetMetadata().GetName()
	ret := retention{refs: refSource{after: after, ahead: &readAhead{records: recs, tags: tagged}}}
	ret.expire, err = unheld(ctx, ret.refs, durable[:max(len(durable)+1-keep, 0)])
	return ret, err
}

// removeExpired removes the files of the snapshots retention expired,
// once the transaction that deleted their records committed, deciding on
// the records read before it. That is as good as reading after it: a
// fork of a snapshot made since bumps its version, so the delete fails
// and the snapshot stays; a sharing record deleted since leaves files
// behind, never removes files a record names.
func (e *Engine) removeExpired(ctx context.Context, a *torporv1.Actor, ret retention, expired []*torporv1.Snapshot) {
	for _, s := range expired {
		refs, err := referencesOf(ctx, ret.refs, s)
		if err != nil || refs.filesKept || e.objects == nil {
			continue
		}
		if err := e.objects.DeleteSnapshot(ctx, s.GetLocation()); err != nil {
			e.logger(a).Warn("remove old snapshot", "snapshot", s.GetMetadata().GetName(), "err", err)
		}
	}
}
