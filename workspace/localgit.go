//go:build unix

package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/server"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// A git source given as a path (a repository on the server's machine,
// under a root the caller allows) is cloned like a remote one, through
// go-git's upload-pack server in this process instead of https: its
// objects and refs are read, nothing of its config, no hook, no git
// binary; a work tree is never read (the clone checks out the commit).
// The repository's directory is bound (its symlinks resolve inside it),
// alternates included, so that no object comes from outside it.

// ErrNotRepository: a local git source that is not a git repository (a
// work tree with a .git directory, or a bare repository).
var ErrNotRepository = errors.New("not a git repository")

// IsLocal says whether a git source is a path on this machine.
func IsLocal(source string) bool { return filepath.IsAbs(source) }

// gitDirOf is the git directory of the repository at dir: dir/.git, or
// dir itself when it is bare. A .git file (a linked work tree, a
// submodule) names a git directory elsewhere: refused.
func gitDirOf(dir string) (string, error) {
	st, err := os.Lstat(filepath.Join(dir, ".git"))
	switch {
	case err == nil && st.IsDir():
		return filepath.Join(dir, ".git"), nil
	case err == nil:
		return "", fmt.Errorf("%w: %s/.git is not a directory (a linked work tree or a submodule): name the repository it belongs to", ErrNotRepository, dir)
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	for _, p := range []string{"HEAD", "objects", "refs"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return "", fmt.Errorf("%w: %s has no .git directory and is no bare repository", ErrNotRepository, dir)
			}
			return "", err
		}
	}
	return dir, nil
}

// localLoader serves the one repository.
type localLoader struct{ s storer.Storer }

func (l localLoader) Load(*transport.Endpoint) (storer.Storer, error) { return l.s, nil }

// localSession is an upload-pack session over the repository at dir. Its
// calls run on goroutines of their own: a clone runs as the clone
// directory's owner on its locked thread (runAs), and the repository is
// read with the server's identity, as a dir source is.
func localSession(dir string) (transport.UploadPackSession, error) {
	gitDir, err := gitDirOf(dir)
	if err != nil {
		return nil, err
	}
	fs := osfs.New(gitDir, osfs.WithBoundOS())
	st := filesystem.NewStorageWithOptions(fs, cache.NewObjectLRUDefault(), filesystem.Options{AlternatesFS: fs})
	ep, err := transport.NewEndpoint(dir)
	if err != nil {
		return nil, err
	}
	sess, err := server.NewServer(localLoader{st}).NewUploadPackSession(ep, nil)
	if err != nil {
		return nil, err
	}
	return &outside{sess, st}, nil
}

// outside runs a session's calls off the calling thread, and peels the
// annotated tags it advertises (go-git's server does not), as git's
// upload-pack does.
type outside struct {
	transport.UploadPackSession
	st storer.EncodedObjectStorer
}

func offThread[T any](fn func() (T, error)) (T, error) {
	var (
		wg  sync.WaitGroup
		v   T
		err error
	)
	wg.Go(func() { v, err = fn() })
	wg.Wait()
	return v, err
}

func (o *outside) AdvertisedReferencesContext(ctx context.Context) (*packp.AdvRefs, error) {
	return offThread(func() (*packp.AdvRefs, error) {
		ar, err := o.UploadPackSession.AdvertisedReferencesContext(ctx)
		if err != nil {
			return nil, err
		}
		for name, h := range ar.References {
			if tag, err := object.GetTag(o.st, h); err == nil && strings.HasPrefix(name, "refs/tags/") {
				if c, err := tag.Commit(); err == nil {
					ar.Peeled[name] = c.Hash
				}
			}
		}
		return ar, nil
	})
}

func (o *outside) AdvertisedReferences() (*packp.AdvRefs, error) {
	return o.AdvertisedReferencesContext(context.Background())
}

func (o *outside) UploadPack(ctx context.Context, req *packp.UploadPackRequest) (*packp.UploadPackResponse, error) {
	return offThread(func() (*packp.UploadPackResponse, error) { return o.UploadPackSession.UploadPack(ctx, req) })
}

// shallowFetch is a local repository's fetch with depth commits of
// history, which go-git's upload-pack server cannot make (it serves
// whole histories, so a local source's depth went unheeded): the objects
// of the commits within depth of wants, of their trees and blobs (not a
// submodule's commit), copied into s, and the commits whose parents were
// left out marked shallow, as git's fetch --depth does. Only for wants
// the repository advertises (a commit no ref names is fetched with the
// refs' whole history, as from a remote). It tells whether s is
// shallow.
func (o *outside) shallowFetch(s *filesystem.Storage, wants []plumbing.Hash, depth int, maxBytes int64) (bool, error) {
	got, err := offThread(func() (*shallowCopy, error) {
		c := &shallowCopy{from: o.st, seen: map[plumbing.Hash]bool{}, left: maxBytes}
		return c, c.walk(wants, depth)
	})
	if err != nil {
		return false, err
	}
	for _, obj := range got.objs {
		if _, err := s.SetEncodedObject(obj); err != nil {
			return false, err
		}
	}
	if len(got.shallow) == 0 {
		return false, nil
	}
	return true, s.SetShallow(got.shallow)
}

// shallowCopy collects the objects of a shallow fetch (shallowFetch).
type shallowCopy struct {
	from    storer.EncodedObjectStorer
	seen    map[plumbing.Hash]bool
	left    int64 // bytes the objects may still take (MaxBytes)
	cap     int64
	objs    []plumbing.EncodedObject
	shallow []plumbing.Hash
}

func (c *shallowCopy) walk(wants []plumbing.Hash, depth int) error {
	c.cap = c.left
	var level []plumbing.Hash
	for _, h := range wants {
		for range 10 { // an annotated tag: it, and what it names
			obj, err := c.add(plumbing.AnyObject, h)
			if err != nil || obj == nil || obj.Type() != plumbing.TagObject {
				if err != nil {
					return err
				}
				break
			}
			tag, err := object.DecodeTag(c.from, obj)
			if err != nil {
				return err
			}
			h = tag.Target
		}
		level = append(level, h)
	}
	for d := 1; d <= depth && len(level) > 0; d++ {
		var next []plumbing.Hash
		for _, h := range level {
			obj, err := c.from.EncodedObject(plumbing.CommitObject, h)
			if err != nil {
				return err
			}
			commit, err := object.DecodeCommit(c.from, obj)
			if err != nil {
				return err
			}
			if _, err := c.add(plumbing.CommitObject, h); err != nil {
				return err
			}
			if err := c.tree(commit.TreeHash); err != nil {
				return err
			}
			if d == depth && len(commit.ParentHashes) > 0 {
				c.shallow = append(c.shallow, h)
				continue
			}
			for _, p := range commit.ParentHashes {
				if !c.seen[p] {
					next = append(next, p)
				}
			}
		}
		level = next
	}
	return nil
}

// tree adds a tree, its subtrees and its blobs.
func (c *shallowCopy) tree(h plumbing.Hash) error {
	obj, err := c.add(plumbing.TreeObject, h)
	if err != nil || obj == nil {
		return err
	}
	t, err := object.DecodeTree(c.from, obj)
	if err != nil {
		return err
	}
	for _, e := range t.Entries {
		switch e.Mode {
		case filemode.Dir:
			err = c.tree(e.Hash)
		case filemode.Submodule:
			// Another repository's commit: left out, as a clone does.
		default:
			_, err = c.add(plumbing.BlobObject, e.Hash)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// add copies an object not added yet (nil for one that was), within the
// cap on bytes.
func (c *shallowCopy) add(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	if c.seen[h] {
		return nil, nil
	}
	c.seen[h] = true
	obj, err := c.from.EncodedObject(t, h)
	if err != nil {
		return nil, err
	}
	if c.left -= obj.Size(); c.left < 0 {
		return nil, &CapError{What: "bytes of pack", Found: c.cap - c.left, Cap: c.cap, More: true}
	}
	r, err := obj.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	mem := &plumbing.MemoryObject{}
	mem.SetType(obj.Type())
	if _, err := io.Copy(mem, r); err != nil {
		return nil, err
	}
	c.objs = append(c.objs, mem)
	return mem, nil
}
