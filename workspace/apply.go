//go:build unix

package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"

	"golang.org/x/sys/unix"
)

// ApplyOptions are Apply's options.
type ApplyOptions struct {
	// Within, if set, is the allowed root the target must lie in (as for
	// Scan).
	Within string
	// Binary writes the changes the diff lists without showing their
	// content too (NotShown: binary, too large, past the diff's cap);
	// without it they are a *NotShownError.
	Binary bool
}

// Applied says what Apply did, path by path.
type Applied struct {
	Written []string `json:"written,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	// Already lists paths the target already holds as the job left them
	// (the changes were applied before): nothing to do.
	Already []string `json:"already,omitempty"`
}

// Apply writes the changes into dir, the directory they were imported
// from (or another copy of it), as dir's owner, every path beneath dir
// without following links. It first checks everything and writes nothing
// unless all of it can go in:
//   - it refuses a dir that is a git directory or lies in one (ErrGitDir);
//   - without opts.Binary, it writes none of the changes the diff lists
//     without showing (*NotShownError: binary, too large, past the cap);
//   - it refuses (*RefusedError) symbolic links, setuid or setgid modes,
//     paths that leave dir or lie under .git, or in a directory git would
//     take for a repository once written (HEAD, objects/, refs/), and
//     contents that are not what the changes say;
//   - it reports a conflict (*ConflictError) for every path whose target
//     is no longer as the import found it (a file edited, created or
//     removed since; a link or a file where a directory was).
//
// Then it deletes, and writes each file to a temporary name beside it and
// renames it into place. Modified files keep their permission bits but
// for the execute bits, which follow the job's; new files get 0644 or
// 0755. Directories that a deletion leaves empty are removed, as git does.
// A failure while writing (a full disk) can leave part of the changes
// written; the error says where.
func Apply(ctx context.Context, dir string, cs *Changes, opts ApplyOptions) (*Applied, error) {
	if err := refuse(cs); err != nil {
		return nil, err
	}
	if err := refuseNotShown(cs, opts.Binary); err != nil {
		return nil, err
	}
	if err := refuseGitPath(dir); err != nil {
		return nil, err
	}
	rootfd, st, err := openRoot(dir, opts.Within)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	if err := refuseGitDir(rootfd, dir); err != nil {
		return nil, err
	}
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return nil, err
	}
	res := &Applied{}
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		b := newBeneath(fd)
		defer b.close()
		bad, err := gitShaped(cs, hasBeneath(b))
		if err != nil {
			return err
		}
		if len(bad) > 0 {
			return &RefusedError{Conflicts: bad}
		}
		plan, err := check(ctx, b, cs)
		if err != nil {
			return err
		}
		return write(ctx, b, plan, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// refuse lists the changes Apply never writes, whatever the target holds.
func refuse(cs *Changes) error {
	var bad []Conflict
	for _, c := range cs.Changes {
		why := ""
		switch {
		case checkName(c.Path) != nil:
			why = "the path leaves the target"
		case inGit(c.Path):
			why = "the path lies under .git"
		case c.New != nil && c.New.Type == TypeSymlink:
			why = "a symbolic link (Apply never writes one)"
		case c.New != nil && c.New.Type != TypeFile:
			why = "not a file"
		case c.New != nil && c.New.Mode&0o6000 != 0:
			why = fmt.Sprintf("a setuid or setgid mode (%04o)", uint32(c.New.Mode))
		case c.New != nil && int64(len(c.New.Data)) != c.New.Size:
			why = fmt.Sprintf("%d bytes of content for a file of %d", len(c.New.Data), c.New.Size)
		case c.New != nil && sha256hex(c.New.Data) != c.New.SHA256:
			why = "the content is not the one the changes name (sha256)"
		case c.Kind != Deleted && c.New == nil, c.Kind != Added && c.Old == nil:
			why = "a change without its " + map[bool]string{true: "new", false: "old"}[c.New == nil] + " side"
		}
		if why != "" {
			bad = append(bad, Conflict{Path: c.Path, Reason: why})
		}
	}
	if len(bad) > 0 {
		return &RefusedError{Conflicts: bad}
	}
	return nil
}

// refuseNotShown: without binary, the changes a person reviewing the
// diff has not seen are not written.
func refuseNotShown(cs *Changes, binary bool) error {
	if binary {
		return nil
	}
	if hidden := cs.NotShown(DiffOptions{}); len(hidden) > 0 {
		return &NotShownError{Changes: hidden}
	}
	return nil
}

func sha256hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// step is one change as check found its target.
type step struct {
	c       *Change
	exists  bool
	st      unix.Stat_t // the target when checked
	already bool        // the target already holds the new side
}

// check compares every touched path of the target with the changes' old
// side, and returns the plan or a *ConflictError.
func check(ctx context.Context, b *beneath, cs *Changes) ([]step, error) {
	deleted := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Old != nil && (c.New == nil || c.New.Type != c.Old.Type) {
			deleted[c.Path] = true
		}
	}
	// Directories the changes put files in: where one stands, a deleted
	// file is gone as it should be.
	newDirs := map[string]bool{}
	for _, c := range cs.Changes {
		if c.New != nil {
			for d := path.Dir(c.Path); d != "." && !newDirs[d]; d = path.Dir(d) {
				newDirs[d] = true
			}
		}
	}
	var conflicts []Conflict
	plan := make([]step, 0, len(cs.Changes))
	for i := range cs.Changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c := &cs.Changes[i]
		s := step{c: c}
		st, err := b.lstat(c.Path)
		switch {
		case err == nil:
			s.exists, s.st = true, *st
		case errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ENOTDIR) && deletedParent(c.Path, deleted):
			// A file where the job put a directory, and the job deleted
			// that file: it goes first.
		case errors.Is(err, unix.ENOTDIR):
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: "a parent is no longer a directory"})
			continue
		case errors.Is(err, unix.ELOOP), errors.Is(err, ErrSymlink):
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: "a parent is now a symbolic link (never followed)"})
			continue
		default:
			return nil, err
		}
		isOld, err := holds(b, &s, c.Old, false)
		if err != nil {
			return nil, err
		}
		isNew, err := holds(b, &s, c.New, true)
		if err != nil {
			return nil, err
		}
		if c.New == nil && s.exists && s.st.Mode&unix.S_IFMT == unix.S_IFDIR && newDirs[c.Path] {
			isNew = true
		}
		switch {
		case isNew:
			// Already as the job left it (a mode-only change holds both).
			s.already = true
		case isOld:
		case c.Old == nil:
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: "created in the target since the import"})
			continue
		case !s.exists:
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: "deleted in the target since the import"})
			continue
		default:
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: "changed in the target since the import"})
			continue
		}
		if !s.already {
			if why := writable(b, c.Path); why != "" {
				conflicts = append(conflicts, Conflict{Path: c.Path, Reason: why})
				continue
			}
		}
		plan = append(plan, s)
	}
	if len(conflicts) > 0 {
		return nil, &ConflictError{Conflicts: conflicts}
	}
	return plan, nil
}

// writable says why the nearest existing directory above p cannot be
// written by the identity Apply runs as ("" if it can): found now rather
// than halfway through the writing.
func writable(b *beneath, p string) string {
	for d := path.Dir(p); ; d = path.Dir(d) {
		rel := d
		if d == "." {
			rel = ""
		}
		fd, err := b.parent(rel)
		if err == nil {
			// AT_EACCESS: as the thread's filesystem identity, not its
			// real one.
			if err := unix.Faccessat(fd, ".", unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
				return fmt.Sprintf("the target's owner cannot write in %s/ (%v)", d, err)
			}
			return ""
		}
		if d == "." || !errors.Is(err, unix.ENOENT) {
			return ""
		}
	}
}

func deletedParent(p string, deleted map[string]bool) bool {
	for d := path.Dir(p); d != "."; d = path.Dir(d) {
		if deleted[d] {
			return true
		}
	}
	return false
}

// holds tells whether the target of s is state want (nil: absent); with
// mode, the execute bits must match too.
func holds(b *beneath, s *step, want *State, mode bool) (bool, error) {
	if want == nil {
		return !s.exists, nil
	}
	if !s.exists {
		return false, nil
	}
	switch s.st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		if want.Type != TypeSymlink {
			return false, nil
		}
		target, err := b.readlink(s.c.Path)
		if err != nil {
			return false, err
		}
		return target == want.Target, nil
	case unix.S_IFREG:
		if want.Type != TypeFile || s.st.Size != want.Size || mode && (s.st.Mode&0o111 != 0) != want.Mode.Exec() {
			return false, nil
		}
		data, err := b.readFile(s.c.Path, want.Size)
		if err != nil {
			return false, err
		}
		if want.Data != nil {
			return bytes.Equal(data, want.Data), nil
		}
		return sha256hex(data) == want.SHA256, nil
	}
	return false, nil
}

// write carries out a checked plan: deletions first (a file may give way
// to a directory), then files. Each target is checked once more, by its
// status, just before it is replaced.
func write(ctx context.Context, b *beneath, plan []step, res *Applied) error {
	for i := range plan {
		s := &plan[i]
		if s.already {
			res.Already = append(res.Already, s.c.Path)
			continue
		}
		if !s.exists || s.c.Old == nil || s.c.New != nil && s.c.New.Type == s.c.Old.Type {
			continue
		}
		if err := unchanged(b, s); err != nil {
			return err
		}
		if err := b.remove(s.c.Path); err != nil {
			return err
		}
		b.removeEmptyParents(s.c.Path)
		if s.c.New == nil {
			res.Deleted = append(res.Deleted, s.c.Path)
		}
		s.exists = false
	}
	for i := range plan {
		if err := ctx.Err(); err != nil {
			return err
		}
		s := &plan[i]
		c := s.c
		if s.already || c.New == nil {
			continue
		}
		perm := uint32(0o644)
		if s.exists {
			if err := unchanged(b, s); err != nil {
				return err
			}
			perm = uint32(s.st.Mode) & 0o777 &^ 0o111
		}
		if c.New.Mode.Exec() {
			perm |= (perm & 0o444) >> 2
		}
		dir, _ := splitParent(c.Path)
		if err := b.mkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := b.createFile(c.Path, bytes.NewReader(c.New.Data), perm, 0, true); err != nil {
			return err
		}
		res.Written = append(res.Written, c.Path)
	}
	return nil
}

// unchanged checks that a target is still what check found.
func unchanged(b *beneath, s *step) error {
	st, err := b.lstat(s.c.Path)
	if err != nil {
		return fmt.Errorf("%s: %w (changed while the changes were applied)", s.c.Path, err)
	}
	if st.Ino != s.st.Ino || st.Size != s.st.Size || st.Mtim != s.st.Mtim || st.Mode != s.st.Mode {
		return &ConflictError{Conflicts: []Conflict{{Path: s.c.Path, Reason: "changed while the changes were applied"}}}
	}
	return nil
}
