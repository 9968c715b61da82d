package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/delegate-dev/delegate"
)

// openWithProject opens a kept sandbox with a project in it (sandboxes
// open --workspace, --git, --cache): a persistent job that imports the
// workspace source and its caches and runs nothing else, as run --keep
// --workspace --script true did; the sandbox is that job's, so that jobs
// diff and jobs apply take its id as they take run --keep's.
//
// --idle and --lifetime are set on the sandbox once the job made it
// (delegate.SandboxTimers): the job's sandbox is made with the server's
// timers, the longest it allows, so none ends before. Timers the server
// refuses release the sandbox.
func (p *Program) openWithProject(ctx context.Context, cfg Config, f sandboxFlags) (err error) {
	spec, err := f.spec()
	if err != nil {
		return err
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Lifecycle: delegate.LifecyclePersistent,
		StatusMode: delegate.StatusModeDetailed, VMTemplate: spec.VMTemplate, Network: spec.Network, Resources: spec.Resources, Caches: f.caches}
	switch {
	case f.workspace != "" && f.git != "":
		return usagef("give --workspace DIR or --git URL, not both")
	case f.workspace != "":
		abs, err := filepath.Abs(f.workspace)
		if err != nil {
			return usagef("--workspace: %v", err)
		}
		// The person running the CLI chose the directory, as for run.
		if rule := cfg.workspaceRootRule(abs); rule != "" {
			return usagef("--workspace: %s %s", abs, rule)
		}
		cfg.WorkspaceRoots = append(cfg.WorkspaceRoots, abs)
		m.Workspace = &delegate.WorkspaceSource{Dir: abs, IncludeIgnored: f.includeIgnored}
	case f.git != "":
		m.Workspace = &delegate.WorkspaceSource{Git: f.git, Ref: f.ref, IncludeIgnored: f.includeIgnored}
	default:
		return usagef("--cache needs --workspace or --git: a cache is kept per project")
	}
	if f.ref != "" && f.git == "" {
		return usagef("--ref goes with --git")
	}
	s, closeSvc, err := p.Open(ctx, cfg, newLogger(p.Stderr, max(cfg.LogLevel, slog.LevelWarn)), true)
	if err != nil {
		return err
	}
	defer closeInto(&err, closeSvc)
	job, err := s.Jobs.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		return projectFlagError(err)
	}
	j := job
	for !j.Status.Terminal() {
		if j, err = s.Jobs.Wait(ctx, job.ID); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil && !j.Status.Terminal() {
			return fmt.Errorf("stopped waiting for %s, which imports the project: %w", job.ID, err)
		}
	}
	if j.Status != delegate.StatusSuccess || j.Sandbox == "" {
		return fmt.Errorf("the sandbox was not opened: %s, which imports the project, is %s: %s ('delegate jobs status %s' says more)",
			j.ID, j.Status, safe(j.Error), j.ID)
	}
	if spec.IdleTimeout != 0 || spec.Lifetime != 0 {
		if err := setTimers(ctx, s.Sandboxes, j.Sandbox, spec); err != nil {
			return err
		}
	}
	if f.asJSON {
		sb, err := s.Sandboxes.GetSandbox(ctx, j.Sandbox)
		if err != nil {
			return err
		}
		return p.printJSON(sb)
	}
	fmt.Fprintln(p.Stdout, j.Sandbox)
	return nil
}

// projectFlagError names the flag of a workspace field the service
// refused, or a limit's (sandboxFlagError).
func projectFlagError(err error) error {
	var fe *delegate.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	if flag, ok := map[string]string{"manifest.workspace.dir": "--workspace", "manifest.workspace.git": "--git", "manifest.workspace.ref": "--ref",
		"manifest.workspace": "--workspace", "manifest.caches": "--cache"}[fe.Field]; ok {
		return fmt.Errorf("%s: %s", flag, fe.Rule)
	}
	return sandboxFlagError(err)
}

// setTimers sets --idle and --lifetime on the sandbox a job made; if
// they cannot be, the sandbox is released.
func setTimers(ctx context.Context, svc delegate.SandboxService, id string, spec delegate.SandboxSpec) error {
	st, ok := svc.(delegate.SandboxTimers)
	var err error
	if !ok {
		err = errors.New("--idle and --lifetime: this delegate cannot set a sandbox's timers: leave them out (the sandbox keeps the server's)")
	} else if _, err = st.SetSandboxTimers(ctx, id, delegate.SandboxSpec{IdleTimeout: spec.IdleTimeout, Lifetime: spec.Lifetime}); err != nil {
		err = sandboxFlagError(err)
	}
	if err != nil {
		if _, _, rerr := svc.ReleaseSandbox(context.WithoutCancel(ctx), id); rerr != nil {
			return errors.Join(err, fmt.Errorf("release sandbox %s: %w", id, rerr))
		}
		return fmt.Errorf("%w (sandbox %s, with the project, was released)", err, id)
	}
	return nil
}
