package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/workspace"
	"github.com/spf13/cobra"
)

// workspaceService is the job service's view of workspaces.
func workspaceService(svc delegate.JobService) (delegate.WorkspaceService, error) {
	ws, ok := svc.(delegate.WorkspaceService)
	if !ok {
		return nil, errors.New("this delegate keeps no workspaces")
	}
	return ws, nil
}

func (p *Program) jobsDiffCmd(cfg *Config) *cobra.Command {
	var patch, asJSON bool
	cmd := &cobra.Command{
		Use:   "diff ID [flags]",
		Short: "Show what a job changed in its workspace",
		Long: `Show what a job changed in the workspace it imported (manifest.workspace) as a
unified diff (binary files named, not shown), or with --patch as a patch that
"git apply" takes. Nothing under .git is ever a change.`,
		Example: `  delegate jobs diff job-abc | less
  delegate jobs diff job-abc --patch > fix.patch && git apply fix.patch`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				ws, err := workspaceService(svc)
				if err != nil {
					return err
				}
				switch {
				case asJSON:
					c, err := ws.Changes(ctx, args[0])
					if err != nil {
						return err
					}
					return p.printJSON(c)
				case patch:
					data, err := ws.Patch(ctx, args[0])
					if err != nil {
						return err
					}
					_, err = p.Stdout.Write(data)
					return err
				}
				for off := int64(0); ; {
					page, err := ws.Diff(ctx, args[0], delegate.DiffOptions{Offset: off, Limit: delegate.MaxDiffPage})
					if err != nil {
						return err
					}
					if _, err := fmt.Fprint(p.Stdout, page.Text); err != nil {
						return err
					}
					if page.Next == 0 {
						return nil
					}
					off = page.Next
				}
			})
		},
	}
	cmd.Flags().BoolVar(&patch, "patch", false, "print a patch for git apply (binary files included)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON (counts and paths)")
	return cmd
}

func (p *Program) jobsApplyCmd(cfg *Config) *cobra.Command {
	var (
		to     string
		branch bool
	)
	cmd := &cobra.Command{
		Use:   "apply ID [--to DIR] [--branch]",
		Short: "Write a job's changes into its source directory, or commit them to a branch",
		Long: `Write what a job changed in its workspace into the directory it was imported
from (or --to another copy of it). Nothing is written unless every file the
changes touch is still as the import found it: otherwise the conflicts are
listed. Symbolic links, setuid or setgid modes, paths that leave the directory
and anything under .git are refused; so is a directory that is a git directory
or lies in one (its hooks and configuration would run). Files are written as
the directory's owner.

With --branch the changes are committed to a new branch delegate/ID of the
directory's git repository, on the commit the import started from, without
touching the checked-out branch, the index or the work tree.`,
		Example: `  delegate jobs apply job-abc
  delegate jobs apply job-abc --branch && git diff HEAD delegate/job-abc`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withService(ctx, *cfg, func(svc delegate.JobService) error {
				ws, err := workspaceService(svc)
				if err != nil {
					return err
				}
				set, err := ws.ChangeSet(ctx, args[0])
				if err != nil {
					return err
				}
				return p.apply(ctx, set, to, branch)
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "write into `DIR` instead of the job's source directory")
	cmd.Flags().BoolVar(&branch, "branch", false, "commit to a new branch delegate/ID instead of writing files")
	return cmd
}

// apply writes (or commits) a change set.
func (p *Program) apply(ctx context.Context, set *delegate.ChangeSet, to string, branch bool) error {
	target := set.Source.Dir
	if to != "" {
		abs, err := filepath.Abs(to)
		if err != nil {
			return usagef("--to: %v", err)
		}
		target = abs
	}
	if target == "" {
		return usagef("--to DIR: job %s imported %s, not a directory here: name a checkout of it", set.JobID, set.Source.Git)
	}
	var cs workspace.Changes
	if err := json.Unmarshal(set.Changes, &cs); err != nil {
		return fmt.Errorf("the changes of job %s: %w", set.JobID, err)
	}
	if len(cs.Changes) == 0 {
		fmt.Fprintf(p.Stderr, "delegate: job %s changed nothing in its workspace\n", set.JobID)
		return nil
	}
	if branch {
		var base workspace.Baseline
		if err := json.Unmarshal(set.Baseline, &base); err != nil {
			return fmt.Errorf("the baseline of job %s: %w", set.JobID, err)
		}
		name := "delegate/" + set.JobID
		commit, err := workspace.CommitBranch(ctx, target, &base, &cs, workspace.BranchOptions{Name: name,
			Message: fmt.Sprintf("delegate: the changes of %s\n\n%d added, %d modified, %d deleted.\n", set.JobID, cs.Added, cs.Modified, cs.Deleted)})
		if err != nil {
			return applyError(err)
		}
		fmt.Fprintf(p.Stdout, "%s %s\n", name, commit)
		fmt.Fprintf(p.Stderr, "delegate: committed the changes of %s to branch %s in %s; the checked-out branch, the index and the work tree are as they were\n",
			files(len(cs.Changes)), name, target)
		return nil
	}
	done, err := workspace.Apply(ctx, target, &cs, workspace.ApplyOptions{})
	if err != nil {
		return applyError(err)
	}
	for _, f := range done.Written {
		fmt.Fprintf(p.Stdout, "written %s\n", f)
	}
	for _, f := range done.Deleted {
		fmt.Fprintf(p.Stdout, "deleted %s\n", f)
	}
	for _, f := range done.Already {
		fmt.Fprintf(p.Stdout, "already %s\n", f)
	}
	fmt.Fprintf(p.Stderr, "delegate: applied the changes of %s to %s (%d written, %d deleted)\n", set.JobID, target, len(done.Written), len(done.Deleted))
	return nil
}

// applyError lists what Apply would not write.
func applyError(err error) error {
	var ce *workspace.ConflictError
	var re *workspace.RefusedError
	var list []workspace.Conflict
	what := ""
	switch {
	case errors.As(err, &ce):
		list, what = ce.Conflicts, "changed here since the import"
	case errors.As(err, &re):
		list, what = re.Conflicts, "refused"
	default:
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "nothing written: %s %s:", files(len(list)), what)
	for _, c := range list {
		fmt.Fprintf(&b, "\n  %s: %s", c.Path, c.Reason)
	}
	return errors.New(b.String())
}
