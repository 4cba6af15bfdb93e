package node

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/validate"
)

// idPattern admits the ids that name files on the node (operation ids,
// actor uids): no path separators, no leading dot.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

func invalid(field, format string, args ...any) error {
	return &validate.FieldError{Path: field, Reason: fmt.Sprintf(format, args...)}
}

func checkID(field, v string) error {
	if v == "" {
		return invalid(field, "required")
	}
	if !idPattern.MatchString(v) {
		return invalid(field, "%q: want letters, digits, '.', '_' or '-' (at most 128, not starting with '.' or '-')", v)
	}
	return nil
}

func validateOperation(op *torporv1.Operation) error {
	if op == nil {
		return invalid("op", "required")
	}
	if err := checkID("op.actorUid", op.GetActorUid()); err != nil {
		return err
	}
	if err := checkID("op.operationId", op.GetOperationId()); err != nil {
		return err
	}
	if op.GetWorker() == "" {
		return invalid("op.worker", "required")
	}
	return nil
}

// validateWorkload checks a workload as the control plane checked its
// template at apply (the same rules, again: the node runs what it is sent
// as root and must not rely on the caller for that); the node's image
// policy is applied where images are read (unpack).
func validateWorkload(op *torporv1.Operation, w *torporv1.Workload) error {
	if err := validateOperation(op); err != nil {
		return err
	}
	switch {
	case w == nil:
		return invalid("workload", "required")
	case w.GetActorUid() != op.GetActorUid():
		return invalid("workload.actorUid", "%q differs from op.actorUid %q", w.GetActorUid(), op.GetActorUid())
	}
	if err := validate.TemplateSpec("workload.template", w.GetTemplate(), image.IsPinned); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%w", err)
	}
	// It is written into the guest's actor.env, one value a line.
	if from := w.GetForkedFrom(); from != "" {
		space, name, _ := strings.Cut(from, "/")
		if err := errors.Join(validate.Name("workload.forkedFrom", space), validate.Name("workload.forkedFrom", name)); err != nil {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%w", err)
		}
	}
	return nil
}

// validateWarm checks a request to warm a worker for a template: its
// workload names no actor, and its template is checked as a start's.
func validateWarm(req *torporv1.WarmRequest) error {
	w := req.GetWorkload()
	switch {
	case req.GetWorker() == "":
		return invalid("worker", "required")
	case w == nil:
		return invalid("workload", "required")
	case w.GetActorUid() != "" || w.GetActor() != "":
		return invalid("workload", "names actor %q (%s): a warm-up is for a template's next actor, whichever it is", w.GetActor(), w.GetActorUid())
	}
	if err := validate.TemplateSpec("workload.template", w.GetTemplate(), image.IsPinned); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%w", err)
	}
	return nil
}

func validateSource(field string, src *torporv1.SnapshotSource) error {
	if src == nil {
		return invalid(field, "required")
	}
	if _, _, _, err := snapshot.ParseLocation(src.GetLocation()); err != nil {
		return invalid(field+".location", "%v", err)
	}
	if src.GetManifestDigest() == "" {
		return invalid(field+".manifestDigest", "required")
	}
	return nil
}

func validateRestore(req *torporv1.RestoreRequest) error {
	switch req.GetScope() {
	case torporv1.RestoreScope_RESTORE_SCOPE_FULL, torporv1.RestoreScope_RESTORE_SCOPE_DATA:
		return validateSource("snapshot", req.GetSnapshot())
	case torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN:
		if req.GetSnapshot() != nil {
			if err := validateSource("snapshot", req.GetSnapshot()); err != nil {
				return err
			}
		}
		return validateSource("golden", req.GetGolden())
	case torporv1.RestoreScope_RESTORE_SCOPE_BOOT:
		return invalid("scope", "BOOT is a cold boot: call Run")
	}
	return invalid("scope", "%s: want FULL, DATA or DATA_ON_GOLDEN", req.GetScope())
}

func validateCheckpoint(req *torporv1.CheckpointRequest) error {
	if err := validateOperation(req.GetOp()); err != nil {
		return err
	}
	switch req.GetScope() {
	case torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA:
	default:
		return invalid("scope", "%s: want FULL or DATA", req.GetScope())
	}
	switch req.GetTarget() {
	case torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL:
	default:
		return invalid("target", "%s: want STORAGE or LOCAL", req.GetTarget())
	}
	if _, _, _, err := snapshot.ParseLocation(req.GetLocation()); err != nil {
		return invalid("location", "%v", err)
	}
	return nil
}
