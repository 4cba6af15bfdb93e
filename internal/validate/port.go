package validate

import torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"

// DefaultWorkloadPort is where a workload listens when its template names
// no port and no HTTP readiness probe.
const DefaultWorkloadPort = 8080

// WorkloadPort is the port routers send an actor's traffic to: its first
// container's port, else that container's HTTP readiness probe's, else
// DefaultWorkloadPort. The control plane's placements and the router's
// own reading of an actor agree because both use it.
func WorkloadPort(spec *torporv1.TemplateSpec) int32 {
	if cs := spec.GetContainers(); len(cs) > 0 {
		if p := cs[0].GetPort(); p > 0 {
			return p
		}
		if p := cs[0].GetReadinessProbe().GetHttpGet().GetPort(); p > 0 {
			return p
		}
	}
	return DefaultWorkloadPort
}
