package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// checkTemplate asks the backend, when it can tell, whether it would take
// the job's template, so that a bad vmTemplate fails the submission (a
// field error) instead of the job's provisioning. fromManifest says the
// submitter chose it; otherwise it is the server's default, and the fault
// is the server's.
func checkTemplate(ctx context.Context, backend sandbox.Backend, name string, fromManifest bool) error {
	tc, ok := backend.(sandbox.TemplateChecker)
	if !ok || name == "" {
		return nil
	}
	err := tc.CheckTemplate(ctx, name)
	if err == nil {
		return nil
	}
	var te *sandbox.TemplateError
	switch {
	case errors.As(err, &te) && fromManifest:
		return &delegate.FieldError{Field: "manifest.vmTemplate", Rule: te.Rule()}
	case errors.As(err, &te):
		// The operator's to fix, so no field error of the submitter's; but
		// the submitter can go round it (naming another): the reason
		// reaches them, classified, not as "failed on the server".
		return fmt.Errorf("the server's default vmTemplate %q cannot be used (name another in vmTemplate, or ask the operator to fix it): %s: %w",
			name, te.Rule(), delegate.ErrInvalid)
	}
	return fmt.Errorf("check vmTemplate %q: %w", name, err)
}

// checkResources asks the backend, when it can tell, whether any of its
// machines could hold the job's resources (sandbox.ResourceChecker).
func checkResources(ctx context.Context, backend sandbox.Backend, m delegate.Manifest, log *slog.Logger) error {
	rc, ok := backend.(sandbox.ResourceChecker)
	if !ok || m.Resources == nil {
		return nil
	}
	mem, _ := delegate.ParseSize(m.Resources.Memory)
	err := rc.CheckResources(ctx, sandbox.Spec{CPU: m.Resources.CPU, MemoryBytes: mem, Template: m.VMTemplate})
	var fe *delegate.FieldError
	if err == nil || errors.As(err, &fe) {
		return err
	}
	log.Warn("the backend could not check the job's resources", "err", err)
	return nil
}
