//go:build unix

package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"golang.org/x/sys/unix"
)

// BranchOptions are CommitBranch's options.
type BranchOptions struct {
	// Name is the branch, "delegate/<job id>" for instance (under
	// refs/heads/; git's rules for ref names). It must not exist yet.
	Name string
	// Message is the commit's message ("delegate: the changes of a job"
	// when empty).
	Message string
	// Author signs the commit (delegate <delegate@localhost> when its
	// name is empty), at When (now when zero).
	Author object.Signature
	// Within, if set, is the allowed root dir must lie in.
	Within string
	// Binary commits the changes the diff lists without showing their
	// content too (as ApplyOptions.Binary).
	Binary bool
}

// CommitBranch commits the changes to a new branch of the git work tree
// dir, on the commit the import started from (base.Head), without
// touching the checked-out branch, HEAD, the index or the work tree: it
// writes the blobs, the trees and a commit object (go-git's plumbing,
// which runs no hook and reads no configuration of the server's), then
// the branch's ref, as dir's owner. A file the job modified carries its
// whole new content, so one that had uncommitted edits at the import
// brings them along; a deletion of a file the commit does not hold is
// nothing to do. A symbolic link is committed as git records one, unless
// its target leaves the work tree (absolute, climbing out, under .git,
// through a link that does; a *RefusedError): a checkout would make it.
// It returns the commit's id.
func CommitBranch(ctx context.Context, dir string, base *Baseline, cs *Changes, opts BranchOptions) (string, error) {
	if err := base.Check(); err != nil {
		return "", err
	}
	if base.Kind != KindGit || base.Head == "" {
		return "", fmt.Errorf("%w: the import was not of a git work tree with a commit", ErrNoBaseCommit)
	}
	ref := "refs/heads/" + opts.Name
	if opts.Name == "" || !validRef(ref) {
		return "", fmt.Errorf("branch %q: not a valid branch name", opts.Name)
	}
	if err := refuseForBranch(cs); err != nil {
		return "", err
	}
	if err := refuseNotShown(cs, opts.Binary); err != nil {
		return "", err
	}
	if opts.Message == "" {
		opts.Message = "delegate: the changes of a job\n"
	}
	if opts.Author.Name == "" {
		opts.Author = object.Signature{Name: "delegate", Email: "delegate@localhost", When: opts.Author.When}
	}
	if opts.Author.When.IsZero() {
		opts.Author.When = time.Now()
	}
	if err := refuseGitPath(dir); err != nil {
		return "", err
	}
	rootfd, st, err := openRoot(dir, opts.Within)
	if err != nil {
		return "", err
	}
	defer unix.Close(rootfd)
	if err := refuseGitDir(rootfd, dir); err != nil {
		return "", err
	}
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return "", err
	}
	var commit plumbing.Hash
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		b := newBeneath(fd)
		defer b.close()
		if gst, err := b.lstat(".git"); err != nil || gst.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("%s: %w: no .git directory (a linked work tree's repository lies elsewhere)", dir, ErrNoBaseCommit)
		}
		gfs, done, err := gitDirFS(b, dir)
		if err != nil {
			return err
		}
		defer done()
		s := filesystem.NewStorage(gfs, cache.NewObjectLRUDefault())
		defer s.Close()
		name := plumbing.ReferenceName(ref)
		if _, err := s.Reference(name); err == nil {
			return fmt.Errorf("branch %s already exists", opts.Name)
		} else if !errors.Is(err, plumbing.ErrReferenceNotFound) {
			return err
		}
		parent, err := object.GetCommit(s, plumbing.NewHash(base.Head))
		if err != nil {
			return fmt.Errorf("%w: commit %s: %w", ErrNoBaseCommit, base.Head, err)
		}
		root, err := loadTree(s, parent.TreeHash)
		if err != nil {
			return err
		}
		// A checkout of the branch writes into the work tree as it is
		// then: what the commit holds and what lies there untracked.
		inWork := hasBeneath(b)
		bad, err := gitShaped(cs, func(p string) (bool, error) {
			if ok, err := inWork(p); ok || err != nil {
				return ok, err
			}
			return hasEntry(s, parent.TreeHash, p)
		})
		if err != nil {
			return err
		}
		if len(bad) > 0 {
			return &RefusedError{Conflicts: bad}
		}
		if bad, err := escapingLinks(s, parent.TreeHash, cs); err != nil || len(bad) > 0 {
			if err != nil {
				return err
			}
			return &RefusedError{Conflicts: bad}
		}
		// Deletions first: a file may give way to a directory.
		for _, c := range cs.Changes {
			if c.Old != nil && (c.New == nil || c.New.Type != c.Old.Type) {
				if err := root.remove(s, strings.Split(c.Path, "/")); err != nil {
					return err
				}
			}
		}
		for i, c := range cs.Changes {
			if i&255 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if c.New == nil {
				continue
			}
			mode, data := filemode.Regular, c.New.Data
			switch {
			case c.New.Type == TypeSymlink:
				mode, data = filemode.Symlink, []byte(c.New.Target)
			case c.New.Mode.Exec():
				mode = filemode.Executable
			}
			h, err := writeObject(s, plumbing.BlobObject, data)
			if err != nil {
				return err
			}
			if err := root.set(s, strings.Split(c.Path, "/"), mode, h); err != nil {
				return err
			}
		}
		treeHash, err := root.write(s)
		if err != nil {
			return err
		}
		if treeHash.IsZero() {
			// Everything deleted: git's empty tree.
			obj := s.NewEncodedObject()
			if err := (&object.Tree{}).Encode(obj); err != nil {
				return err
			}
			if treeHash, err = s.SetEncodedObject(obj); err != nil {
				return err
			}
		}
		c := &object.Commit{Author: opts.Author, Committer: opts.Author, Message: opts.Message,
			TreeHash: treeHash, ParentHashes: []plumbing.Hash{parent.Hash}}
		obj := s.NewEncodedObject()
		if err := c.Encode(obj); err != nil {
			return err
		}
		if commit, err = s.SetEncodedObject(obj); err != nil {
			return err
		}
		return s.SetReference(plumbing.NewHashReference(name, commit))
	})
	if err != nil {
		return "", err
	}
	return commit.String(), nil
}

// refuseForBranch: the refusals that matter for a commit (a link is only
// a blob there; modes are git's two).
func refuseForBranch(cs *Changes) error {
	var bad []Conflict
	for _, c := range cs.Changes {
		switch {
		case checkName(c.Path) != nil:
			bad = append(bad, Conflict{Path: c.Path, Reason: "not a clean relative path"})
		case inGit(c.Path):
			bad = append(bad, Conflict{Path: c.Path, Reason: "the path lies under .git"})
		case c.New != nil && c.New.Type == TypeFile && sha256hex(c.New.Data) != c.New.SHA256:
			bad = append(bad, Conflict{Path: c.Path, Reason: "the content is not the one the changes name (sha256)"})
		case c.New != nil && c.New.Type != TypeFile && c.New.Type != TypeSymlink:
			bad = append(bad, Conflict{Path: c.Path, Reason: "not a file or a link"})
		}
	}
	if len(bad) > 0 {
		return &RefusedError{Conflicts: bad}
	}
	return nil
}

// hasEntry tells whether the tree h holds path p (slash-separated).
func hasEntry(s *filesystem.Storage, h plumbing.Hash, p string) (bool, error) {
	_, ok, err := entryAt(s, h, p)
	return ok, err
}

// entryAt finds path p (slash-separated) in the tree h.
func entryAt(s *filesystem.Storage, h plumbing.Hash, p string) (object.TreeEntry, bool, error) {
	parts := strings.Split(p, "/")
	for i, name := range parts {
		t, err := loadTree(s, h)
		if err != nil {
			return object.TreeEntry{}, false, err
		}
		e, ok := t.entries[name]
		if !ok {
			return object.TreeEntry{}, false, nil
		}
		if i == len(parts)-1 {
			return e, true, nil
		}
		if e.Mode != filemode.Dir {
			return object.TreeEntry{}, false, nil
		}
		h = e.Hash
	}
	return object.TreeEntry{}, false, nil
}

// maxLinkDepth bounds the links followed to resolve one link's target.
const maxLinkDepth = 8

// escapingLinks lists the links the changes make whose target, resolved
// in the tree the branch will hold (the commit h with the changes, links
// followed), leaves the work tree, enters a .git directory, is empty or
// loops: checking the branch out would make a link to anywhere (Apply
// writes no link at all).
func escapingLinks(s *filesystem.Storage, h plumbing.Hash, cs *Changes) ([]Conflict, error) {
	side := map[string]*State{}
	for i := range cs.Changes {
		side[cs.Changes[i].Path] = cs.Changes[i].New
	}
	// linkAt returns the target of the link at p in the branch's tree.
	linkAt := func(p string) (string, bool, error) {
		if st, ok := side[p]; ok {
			if st != nil && st.Type == TypeSymlink {
				return st.Target, true, nil
			}
			return "", false, nil
		}
		e, ok, err := entryAt(s, h, p)
		if err != nil || !ok || e.Mode != filemode.Symlink {
			return "", false, err
		}
		b, err := object.GetBlob(s, e.Hash)
		if err != nil {
			return "", false, err
		}
		r, err := b.Reader()
		if err != nil {
			return "", false, err
		}
		defer r.Close()
		var sb strings.Builder
		if _, err := io.Copy(&sb, io.LimitReader(r, 1<<16)); err != nil {
			return "", false, err
		}
		return sb.String(), true, nil
	}
	// resolve walks target from the directory dir (its parts), following
	// the links on the way, and returns where it leads, or why it leaves
	// ("" when it stays).
	var resolve func(dir []string, target string, depth int) ([]string, string, error)
	resolve = func(dir []string, target string, depth int) ([]string, string, error) {
		switch {
		case depth > maxLinkDepth:
			return nil, "its target goes through more than 8 links (a loop?)", nil
		case target == "":
			return nil, "an empty target", nil
		case strings.HasPrefix(target, "/"):
			return nil, "its target " + quoteName(target) + " is absolute: it leaves the work tree", nil
		}
		cur := append([]string(nil), dir...)
		for _, c := range strings.Split(target, "/") {
			switch c {
			case "", ".":
				continue
			case "..":
				if len(cur) == 0 {
					return nil, "its target " + quoteName(target) + " leaves the work tree", nil
				}
				cur = cur[:len(cur)-1]
				continue
			}
			if gitName(c) {
				return nil, "its target " + quoteName(target) + " lies under .git", nil
			}
			cur = append(cur, c)
			here := strings.Join(cur, "/")
			t, isLink, err := linkAt(here)
			if err != nil {
				return nil, "", err
			}
			if isLink {
				// Where that link leads, links followed, is where the
				// walk goes on.
				to, why, err := resolve(cur[:len(cur)-1], t, depth+1)
				if err != nil || why != "" {
					if why != "" {
						why = "its target goes through the link " + quoteName(here) + ", and " + why
					}
					return nil, why, err
				}
				cur = to
			}
		}
		return cur, "", nil
	}
	var bad []Conflict
	for _, c := range cs.Changes {
		if c.New == nil || c.New.Type != TypeSymlink {
			continue
		}
		dir := strings.Split(path.Dir(c.Path), "/")
		if path.Dir(c.Path) == "." {
			dir = nil
		}
		_, why, err := resolve(dir, c.New.Target, 0)
		if err != nil {
			return nil, err
		}
		if why != "" {
			bad = append(bad, Conflict{Path: c.Path, Reason: "a symbolic link whose " + strings.TrimPrefix(why, "its ")})
		}
	}
	return bad, nil
}

func writeObject(s *filesystem.Storage, typ plumbing.ObjectType, data []byte) (plumbing.Hash, error) {
	obj := s.NewEncodedObject()
	obj.SetType(typ)
	obj.SetSize(int64(len(data)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(data); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(obj)
}

// tree is a git tree being edited: its entries, and the subtrees loaded
// because something below them changes.
type tree struct {
	entries map[string]object.TreeEntry
	subs    map[string]*tree
}

func loadTree(s *filesystem.Storage, h plumbing.Hash) (*tree, error) {
	t := &tree{entries: map[string]object.TreeEntry{}, subs: map[string]*tree{}}
	if h.IsZero() {
		return t, nil
	}
	ot, err := object.GetTree(s, h)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", h, err)
	}
	for _, e := range ot.Entries {
		t.entries[e.Name] = e
	}
	return t, nil
}

// sub returns the subtree name, loaded or made; create says whether to
// make one (replacing a file of that name).
func (t *tree) sub(s *filesystem.Storage, name string, create bool) (*tree, error) {
	if st, ok := t.subs[name]; ok {
		return st, nil
	}
	e, ok := t.entries[name]
	switch {
	case ok && e.Mode == filemode.Dir:
		st, err := loadTree(s, e.Hash)
		if err != nil {
			return nil, err
		}
		t.subs[name] = st
		return st, nil
	case !create:
		return nil, nil
	}
	st, _ := loadTree(s, plumbing.ZeroHash)
	delete(t.entries, name)
	t.subs[name] = st
	return st, nil
}

func (t *tree) set(s *filesystem.Storage, parts []string, mode filemode.FileMode, h plumbing.Hash) error {
	if len(parts) == 1 {
		delete(t.subs, parts[0])
		t.entries[parts[0]] = object.TreeEntry{Name: parts[0], Mode: mode, Hash: h}
		return nil
	}
	st, err := t.sub(s, parts[0], true)
	if err != nil {
		return err
	}
	return st.set(s, parts[1:], mode, h)
}

func (t *tree) remove(s *filesystem.Storage, parts []string) error {
	if len(parts) == 1 {
		if e, ok := t.entries[parts[0]]; ok && e.Mode != filemode.Dir {
			delete(t.entries, parts[0])
		}
		return nil
	}
	st, err := t.sub(s, parts[0], false)
	if err != nil || st == nil {
		return err
	}
	return st.remove(s, parts[1:])
}

// write stores the edited subtrees, then this tree, in git's order; an
// empty subtree disappears, as git has no empty directories.
func (t *tree) write(s *filesystem.Storage) (plumbing.Hash, error) {
	for name, st := range t.subs {
		h, err := st.write(s)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if h.IsZero() {
			delete(t.entries, name)
		} else {
			t.entries[name] = object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h}
		}
	}
	if len(t.entries) == 0 {
		return plumbing.ZeroHash, nil
	}
	ot := &object.Tree{}
	for _, e := range t.entries {
		ot.Entries = append(ot.Entries, e)
	}
	sort.Sort(object.TreeEntrySorter(ot.Entries))
	obj := s.NewEncodedObject()
	if err := ot.Encode(obj); err != nil {
		return plumbing.ZeroHash, err
	}
	return s.SetEncodedObject(obj)
}
