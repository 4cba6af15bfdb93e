package node

import (
	"context"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// identityHook gives the workload its identity (certificate and key,
// mounted in the sandbox), renews it while the workload runs and
// revokes it with the workload.
type identityHook struct {
	identity *workloadIdentity
}

func (identityHook) hookName() string { return "identity" }

func (h identityHook) starting(ctx context.Context, s *slot, w *torporv1.Workload, _ bootSource) (map[string]string, error) {
	return h.identity.prepare(ctx, s, w)
}

// running renews the identity from when the workload is ready: a start
// that fails before drops it (stopped).
func (h identityHook) running(_ context.Context, s *slot, w *torporv1.Workload) {
	h.identity.keep(s, w)
}

// adopted renews the identity of a workload a previous agent started,
// from the certificate on disk.
func (h identityHook) adopted(s *slot, w *torporv1.Workload) {
	h.identity.keep(s, w)
}

func (h identityHook) stopped(s *slot) error {
	return h.identity.drop(s)
}
