package validate

import (
	"fmt"
	"regexp"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Limits on sizes keep one record well under what a request may carry,
// and a template small: an actor's record carries its template's spec, and
// the router reads it on every request. docs/operations.md lists them.
const (
	maxNameLen       = 63
	maxContainers    = 16
	maxVolumes       = 32
	maxStringsInList = 256
	maxStringLen     = 4096
	maxLabels        = 64
	// Per container.
	maxArgBytes   = 32 << 10 // command and args together
	maxEnv        = 256
	maxEnvNameLen = 256
	maxEnvBytes   = 32 << 10 // names and values together
	maxMounts     = 32
	// Paths inside the sandbox: mounts, workingDir, probe paths.
	maxPathLen = 1024
	// A template's whole spec, encoded.
	maxTemplateBytes = 64 << 10
	// Warm workers of one template: more than a node holds is a typo.
	maxWarmWorkers = 256
)

// WorkerNamespace is the space node agents register their workers in, the
// one the control plane schedules from and the CLI lists by default.
const WorkerNamespace = "torpor-system"

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Name checks a DNS-1123 label.
func Name(path, name string) error {
	switch {
	case name == "":
		return fieldErr(path, "required")
	case len(name) > maxNameLen:
		return fieldErr(path, "%q is longer than %d characters", name, maxNameLen)
	case !dns1123Label.MatchString(name):
		return fieldErr(path, "%q is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)", name)
	}
	return nil
}

// Labels checks label or selector maps: keys are DNS-1123 labels optionally
// prefixed by a DNS subdomain and '/', values short strings.
func Labels(path string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return fieldErr(path, "more than %d entries", maxLabels)
	}
	for k, v := range labels {
		key := k
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			key = k[i+1:]
		}
		if !dns1123Label.MatchString(strings.ToLower(key)) || len(k) > 253 {
			return fieldErr(fmt.Sprintf("%s[%q]", path, k), "key is not a valid label key")
		}
		if len(v) > maxNameLen {
			return fieldErr(fmt.Sprintf("%s[%q]", path, k), "value longer than %d characters", maxNameLen)
		}
	}
	return nil
}

// Meta checks the user-settable part of a record's metadata.
func Meta(meta *torporv1.ObjectMeta, needSpace bool) error {
	if meta == nil {
		return fieldErr("metadata", "required")
	}
	if err := Name("metadata.name", meta.GetName()); err != nil {
		return err
	}
	if needSpace {
		if err := Name("metadata.space", meta.GetSpace()); err != nil {
			return err
		}
	}
	return Labels("metadata.labels", meta.GetLabels())
}

// Space checks a space record.
func Space(s *torporv1.Space) error { return Meta(s.GetMetadata(), false) }

// Actor checks an actor's metadata and spec.
func Actor(a *torporv1.Actor) error {
	if err := Meta(a.GetMetadata(), true); err != nil {
		return err
	}
	return ActorSpec(a.GetSpec())
}

// ActorSpec checks the mutable part of an actor.
func ActorSpec(spec *torporv1.ActorSpec) error {
	if spec == nil {
		return fieldErr("spec", "required")
	}
	if err := Name("spec.template", spec.GetTemplate()); err != nil {
		return err
	}
	if err := Revision("spec.templateRevision", spec.GetTemplateRevision()); err != nil {
		return err
	}
	return Labels("spec.workerSelector", spec.GetWorkerSelector())
}

// Worker checks a worker registration.
func Worker(w *torporv1.Worker) error {
	if err := Meta(w.GetMetadata(), true); err != nil {
		return err
	}
	spec := w.GetSpec()
	if spec == nil {
		return fieldErr("spec", "required")
	}
	if err := Name("spec.node", spec.GetNode()); err != nil {
		return err
	}
	if spec.GetIp() == "" {
		return fieldErr("spec.ip", "required")
	}
	if spec.GetSandboxClass() == "" {
		return fieldErr("spec.sandboxClass", "required")
	}
	return nil
}
