package sandbox

import (
	"context"
	"fmt"
	"strings"
)

// TemplateChecker is implemented by a backend that can tell, when a job is
// submitted, whether it would accept its template (Spec.Template), so that
// a bad vmTemplate is refused at once, naming the field, instead of
// failing the job's provisioning later.
type TemplateChecker interface {
	// CheckTemplate returns nil if Create would accept Spec.Template =
	// name. A *TemplateError means the name is wrong (the submitter's
	// mistake); any other error is the backend's own trouble.
	CheckTemplate(ctx context.Context, name string) error
}

// TemplateError says why a backend will not use a template, and which
// ones it would.
type TemplateError struct {
	Name   string
	Reason string // e.g. `no root filesystem "x" in /var/lib/delegate/rootfs`
	// Available lists the names that may be given instead (empty: none).
	Available []string
}

// Rule is the reason and the names available, without the name refused:
// the text of a field error on vmTemplate.
func (e *TemplateError) Rule() string {
	if len(e.Available) == 0 {
		return e.Reason + "; none is available"
	}
	return fmt.Sprintf("%s; available: %s", e.Reason, strings.Join(e.Available, ", "))
}

func (e *TemplateError) Error() string { return fmt.Sprintf("template %q: %s", e.Name, e.Rule()) }

// ResourceChecker is implemented by a backend that can tell, when a job is
// submitted, that none of its machines could ever hold the job's
// resources (a VM with more vCPUs than any node has cores), so that the
// job is refused then instead of failing later.
type ResourceChecker interface {
	// CheckResources returns a *delegate.FieldError naming the resource
	// that no machine has, nil if one might have it, or another error for
	// the backend's own trouble (the job is then accepted: provisioning
	// will tell).
	CheckResources(ctx context.Context, spec Spec) error
}
