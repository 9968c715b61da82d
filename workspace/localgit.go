//go:build unix

package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/cache"
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
