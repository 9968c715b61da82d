package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/workspace"
	"github.com/spf13/cobra"
)

// workspaceService is the services' view of workspaces.
func workspaceService(s Services) (delegate.WorkspaceService, error) {
	if s.Workspaces == nil {
		return nil, errors.New("this delegate keeps no workspaces")
	}
	return s.Workspaces, nil
}

func (p *Program) jobsDiffCmd(cfg *Config) *cobra.Command {
	var patch, asJSON, raw bool
	cmd := &cobra.Command{
		Use:   "diff ID|SANDBOX [flags]",
		Short: "Show what a job changed in its workspace",
		Long: `Show what a job changed in the workspace it imported (manifest.workspace) as a
unified diff, or with --patch as a patch that "git apply" takes. Nothing under
.git is ever a change. A kept sandbox's id stands for its latest command that
has ended: all the sandbox's changes since the import, or, once some were
applied to its source directory ("jobs apply"), those since.

A change git calls binary (a NUL byte in its first 8000 bytes), one too large
to show and one past the diff's cap are listed with their size, mode and
sha256, not shown: "jobs apply" writes them only with --binary. On a terminal
every control character and escape sequence of the diff is written as text
([8m, 
), so that what you read is what apply writes; --raw, and a file or
a pipe, get the bytes exact.`,
		Example: `  delegate jobs diff job-abc | less
  delegate jobs diff job-abc --patch > fix.patch && git apply fix.patch`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withServices(ctx, *cfg, func(svc Services) error {
				ws, err := workspaceService(svc)
				if err != nil {
					return err
				}
				id := args[0]
				var since *workspace.Changes
				if strings.HasPrefix(id, "sbx-") {
					// A sandbox's: its latest command's, from what the last
					// apply into its source directory wrote.
					if id, since, err = p.sandboxChanges(ctx, ws, id); err != nil {
						return err
					}
				}
				out, finish := reviewOutput(p.Stdout, raw)
				if since != nil {
					err = writeChanges(since, out, patch, asJSON)
				} else {
					err = p.writeDiff(ctx, ws, id, out, patch, asJSON)
				}
				if err != nil {
					finish()
					return err
				}
				return finish()
			})
		},
	}
	cmd.Flags().BoolVar(&patch, "patch", false, "print a patch for git apply (binary files included)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON (counts and paths)")
	cmd.Flags().BoolVar(&raw, "raw", false, "write the bytes exact on a terminal too (control characters and escape sequences included)")
	return cmd
}

// sandboxChanges finds a sandbox's latest command that has ended and,
// when its changes were applied to its source directory before, what
// changed since.
func (p *Program) sandboxChanges(ctx context.Context, ws delegate.WorkspaceService, sbx string) (string, *workspace.Changes, error) {
	set, err := ws.ChangeSet(ctx, sbx)
	if err != nil {
		return "", nil, err
	}
	p.tellLatest(sbx, set)
	if set.Source.Dir == "" {
		return set.JobID, nil, nil
	}
	target := filepath.Clean(set.Source.Dir)
	cs, since, err := sinceApplied(ctx, ws, set, target)
	if err != nil || since == "" {
		return set.JobID, nil, err
	}
	fmt.Fprintf(p.Stderr, "delegate: the changes since those of %s were applied to %s\n", since, quoteName(target))
	return set.JobID, cs, nil
}

// writeChanges writes changes computed here as writeDiff writes a job's.
func writeChanges(cs *workspace.Changes, out io.Writer, patch, asJSON bool) error {
	switch {
	case asJSON:
		sum := delegate.WorkspaceChanges{Added: cs.Added, Modified: cs.Modified, Deleted: cs.Deleted, Bytes: cs.Bytes, Files: []delegate.ChangedFile{}}
		for i, c := range cs.Changes {
			if i == delegate.MaxChangedFiles {
				sum.More = len(cs.Changes) - i
				break
			}
			f := delegate.ChangedFile{Path: c.Path, Kind: string(c.Kind), Binary: c.Binary}
			if c.New != nil {
				f.Size = c.New.Size
			}
			sum.Files = append(sum.Files, f)
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(sum)
	case patch:
		data, err := cs.Patch(0)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	for off := int64(0); ; {
		page := cs.Diff(workspace.DiffOptions{Offset: off, Limit: delegate.MaxDiffPage})
		if _, err := io.WriteString(out, page.Text); err != nil {
			return err
		}
		if page.Next == 0 {
			return nil
		}
		off = page.Next
	}
}

// writeDiff writes a job's diff (or its patch, or its summary) to out.
func (p *Program) writeDiff(ctx context.Context, ws delegate.WorkspaceService, id string, out io.Writer, patch, asJSON bool) error {
	switch {
	case asJSON:
		c, err := ws.Changes(ctx, id)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(c)
	case patch:
		data, err := ws.Patch(ctx, id)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	for off := int64(0); ; {
		page, err := ws.Diff(ctx, id, delegate.DiffOptions{Offset: off, Limit: delegate.MaxDiffPage})
		if err != nil {
			return err
		}
		if _, err := io.WriteString(out, page.Text); err != nil {
			return err
		}
		if page.Next == 0 {
			return nil
		}
		off = page.Next
	}
}

func (p *Program) jobsApplyCmd(cfg *Config) *cobra.Command {
	var (
		to             string
		branch, binary bool
	)
	cmd := &cobra.Command{
		Use:   "apply ID|SANDBOX [--to DIR] [--branch] [--binary]",
		Short: "Write a job's changes into its source directory, or commit them to a branch",
		Long: `Write what a job changed in its workspace into the directory it was imported
from (or --to another copy of it). Nothing is written unless every file the
changes touch is still as the import found it: otherwise the conflicts are
listed. A kept sandbox's id stands for its latest command that has ended.
Applies of one sandbox's changes (or one job's) into a directory follow each
other: the next starts from what the last wrote there, so that only what
someone else changed there since is a conflict. Symbolic links, setuid or setgid modes, paths that leave the directory
and anything under .git are refused; so is a directory that is a git directory
or lies in one (its hooks and configuration would run). Files are written as
the directory's owner.

With --branch the changes are committed to a new branch delegate/ID of the
directory's git repository, on the commit the import started from, without
touching the checked-out branch, the index or the work tree. Symbolic links go
in, but not one whose target leaves the work tree or lies under .git.

What "jobs diff" lists without showing (a change git calls binary, one too
large to show, one past the diff's cap) is written, or committed, only with
--binary: without it, apply lists them with their size, mode and sha256 and
writes nothing. Names are written quoted when they hold control characters.`,
		Example: `  delegate jobs apply job-abc
  delegate jobs apply job-abc --branch && git diff HEAD delegate/job-abc`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withServices(ctx, *cfg, func(svc Services) error {
				ws, err := workspaceService(svc)
				if err != nil {
					return err
				}
				set, err := ws.ChangeSet(ctx, args[0])
				if err != nil {
					return err
				}
				p.tellLatest(args[0], set)
				return p.apply(ctx, ws, set, to, branch, binary)
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "write into `DIR` instead of the job's source directory")
	cmd.Flags().BoolVar(&branch, "branch", false, "commit to a new branch delegate/ID instead of writing files")
	cmd.Flags().BoolVar(&binary, "binary", false, "write the changes the diff lists without showing too (binary, too large to show)")
	return cmd
}

// tellLatest says which command a sandbox's id stood for.
func (p *Program) tellLatest(arg string, set *delegate.ChangeSet) {
	if arg != set.JobID {
		fmt.Fprintf(p.Stderr, "delegate: %s: the changes of its latest command that has ended, %s (all since the import)\n", arg, set.JobID)
	}
}

// applyTarget is where apply writes: --to, or the source directory.
func applyTarget(set *delegate.ChangeSet, to string) (string, error) {
	if to == "" {
		if set.Source.Dir == "" {
			return "", usagef("--to DIR: job %s imported %s, not a directory here: name a checkout of it", set.JobID, set.Source.Git)
		}
		return filepath.Clean(set.Source.Dir), nil
	}
	abs, err := filepath.Abs(to)
	if err != nil {
		return "", usagef("--to: %v", err)
	}
	return abs, nil
}

// sinceApplied is a change set's changes from the state the last apply
// into target from the same sandbox left there (the whole changes when
// there was none), and the job of that apply ("" for none).
func sinceApplied(ctx context.Context, ws delegate.WorkspaceService, set *delegate.ChangeSet, target string) (*workspace.Changes, string, error) {
	cs, err := decodeChanges(set)
	if err != nil {
		return nil, "", err
	}
	prev, err := ws.LastApplied(ctx, set.JobID, target)
	if err != nil || prev == nil {
		return cs, "", err
	}
	before, err := decodeChanges(prev)
	if err != nil {
		return nil, "", err
	}
	since, err := cs.Since(before)
	if err != nil {
		return nil, "", safeError{fmt.Errorf("from what %s wrote into %s: %w", prev.JobID, target, err)}
	}
	return since, prev.JobID, nil
}

func decodeChanges(set *delegate.ChangeSet) (*workspace.Changes, error) {
	var cs workspace.Changes
	if err := json.Unmarshal(set.Changes, &cs); err != nil {
		return nil, fmt.Errorf("the changes of job %s: %w", set.JobID, err)
	}
	return &cs, nil
}

// apply writes (or commits) a change set: written into a directory, from
// what the last apply there from the same sandbox wrote, which it then
// records.
func (p *Program) apply(ctx context.Context, ws delegate.WorkspaceService, set *delegate.ChangeSet, to string, branch, binary bool) error {
	target, err := applyTarget(set, to)
	if err != nil {
		return err
	}
	if branch {
		whole, err := decodeChanges(set)
		if err != nil {
			return err
		}
		if len(whole.Changes) == 0 {
			fmt.Fprintf(p.Stderr, "delegate: job %s changed nothing in its workspace\n", set.JobID)
			return nil
		}
		return p.commitBranch(ctx, set, whole, target, binary)
	}
	cs, since, err := sinceApplied(ctx, ws, set, target)
	if err != nil {
		return err
	}
	if since == "" && len(cs.Changes) == 0 {
		fmt.Fprintf(p.Stderr, "delegate: job %s changed nothing in its workspace\n", set.JobID)
		return nil
	}
	if len(cs.Changes) == 0 {
		fmt.Fprintf(p.Stderr, "delegate: nothing to write: %s holds the changes of %s already (written with those of %s)\n", quoteName(target), set.JobID, since)
		return ws.RecordApplied(ctx, set.JobID, target)
	}
	done, err := workspace.Apply(ctx, target, cs, workspace.ApplyOptions{Binary: binary})
	if err != nil {
		return applyError(err, set.JobID, since)
	}
	// Written: the next apply here starts from it. Not recorded, the next
	// would see these files as someone else's changes.
	if err := ws.RecordApplied(ctx, set.JobID, target); err != nil {
		return fmt.Errorf("the changes were written, but not recorded (the next apply of this sandbox's changes here will take them for someone else's): %w", err)
	}
	for _, f := range done.Written {
		fmt.Fprintf(p.Stdout, "written %s\n", quoteName(f))
	}
	for _, f := range done.Deleted {
		fmt.Fprintf(p.Stdout, "deleted %s\n", quoteName(f))
	}
	for _, f := range done.Already {
		fmt.Fprintf(p.Stdout, "already %s\n", quoteName(f))
	}
	from := ""
	if since != "" {
		from = fmt.Sprintf(", from what %s wrote there", since)
	}
	fmt.Fprintf(p.Stderr, "delegate: applied the changes of %s to %s (%d written, %d deleted%s)\n", set.JobID, quoteName(target), len(done.Written), len(done.Deleted), from)
	return nil
}

// commitBranch commits a change set (all since the import) to a new
// branch delegate/ID.
func (p *Program) commitBranch(ctx context.Context, set *delegate.ChangeSet, cs *workspace.Changes, target string, binary bool) error {
	var base workspace.Baseline
	if err := json.Unmarshal(set.Baseline, &base); err != nil {
		return fmt.Errorf("the baseline of job %s: %w", set.JobID, err)
	}
	name := "delegate/" + set.JobID
	commit, err := workspace.CommitBranch(ctx, target, &base, cs, workspace.BranchOptions{Name: name, Binary: binary,
		Message: fmt.Sprintf("delegate: the changes of %s\n\n%d added, %d modified, %d deleted.\n", set.JobID, cs.Added, cs.Modified, cs.Deleted)})
	if err != nil {
		return applyError(err, set.JobID, "")
	}
	fmt.Fprintf(p.Stdout, "%s %s\n", name, commit)
	fmt.Fprintf(p.Stderr, "delegate: committed the changes of %s to branch %s in %s; the checked-out branch, the index and the work tree are as they were\n",
		files(len(cs.Changes)), name, target)
	return nil
}

// quoteName writes a file name as Go quotes a string (\x1b, \a, \u202e)
// when it holds a control character, invalid UTF-8, a character that
// reorders or hides text, a quote or a backslash; as it is otherwise. A
// name is a job's: it must not drive the terminal, nor read as another.
func quoteName(name string) string {
	if safe(name) == name && !strings.ContainsAny(name, "\"\\") {
		return name
	}
	return strconv.Quote(name)
}

// applyError lists what Apply would not write (since: the job whose
// changes the target was checked against, "" for the import).
func applyError(err error, id, since string) error {
	var ce *workspace.ConflictError
	var re *workspace.RefusedError
	var ns *workspace.NotShownError
	var list []workspace.Conflict
	what := ""
	switch {
	case errors.As(err, &ce) && since != "":
		list, what = ce.Conflicts, "changed here since the changes of "+since+" were applied"
	case errors.As(err, &ce):
		list, what = ce.Conflicts, "changed here since the import"
	case errors.As(err, &re):
		list, what = re.Conflicts, "refused"
	case errors.As(err, &ns):
		list, what = ns.Changes, fmt.Sprintf("that 'delegate jobs diff' lists without showing; 'delegate jobs apply %s --binary' writes them", id)
	default:
		return safeError{err}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "nothing written: %s %s:", files(len(list)), what)
	for _, c := range list {
		fmt.Fprintf(&b, "\n  %s: %s", quoteName(c.Path), safe(c.Reason))
	}
	return errors.New(b.String())
}

// safeError is an error whose text may hold a job's file names: written
// escaped (see safe), still matched by errors.Is and errors.As.
type safeError struct{ err error }

func (e safeError) Error() string { return safe(e.err.Error()) }
func (e safeError) Unwrap() error { return e.err }
