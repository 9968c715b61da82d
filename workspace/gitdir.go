//go:build unix

package workspace

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A source directory a person names, and the directory changes are
// applied to, must be neither a git directory nor inside one: a job's
// files there would be hooks and configuration (core.fsmonitor,
// core.hooksPath, core.sshCommand, core.pager, aliases, include.path)
// that git runs as the repository's owner. Inside a work tree, the
// changes never touch .git (inGit); these checks keep the whole tree from
// being a .git.

// refuseGitPath refuses dir, an absolute path as given, when one of its
// components names a .git directory: as given and as cleaned (so that
// REPO/.git/../.git and REPO/.git/.. are refused too, whatever ".."
// resolves to).
func refuseGitPath(dir string) error {
	for _, p := range []string{dir, filepath.Clean(dir)} {
		for _, c := range strings.Split(filepath.ToSlash(p), "/") {
			if gitName(c) {
				return fmt.Errorf("%s: %w: its component %q names a .git directory", dir, ErrGitDir, c)
			}
		}
	}
	return nil
}

// refuseGitDir refuses the directory open as fd (dir as given) when it is
// a git directory or lies in one: its real path (links resolved) names a
// .git, or it or a directory above it holds what git takes for a
// repository (HEAD, objects/ and refs/: what `git rev-parse --git-dir`
// finds in a bare repository).
func refuseGitDir(fd int, dir string) error {
	if err := refuseGitPath(dir); err != nil {
		return err
	}
	real := fdPath(fd, dir)
	if real != "" && real != filepath.Clean(dir) {
		if err := refuseGitPath(real); err != nil {
			return fmt.Errorf("%s (%s): %w", dir, real, ErrGitDir)
		}
	}
	if gitDirAt(fd) {
		return fmt.Errorf("%s: %w: it holds HEAD, objects/ and refs/ (a repository)", dir, ErrGitDir)
	}
	if real == "" {
		real = filepath.Clean(dir)
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		if pfd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			is := gitDirAt(pfd)
			unix.Close(pfd)
			if is {
				return fmt.Errorf("%s: %w: it lies in %s, which holds HEAD, objects/ and refs/ (a repository)", dir, ErrGitDir, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// gitDirAt tells whether the directory open as fd is what git takes for a
// repository (setup.c, is_git_directory): HEAD, objects/ and refs/. It
// asks less than git does (HEAD's content is not read): a directory that
// only looks like one is refused too.
func gitDirAt(fd int) bool {
	var st unix.Stat_t
	if unix.Fstatat(fd, "HEAD", &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	for _, d := range []string{"objects", "refs"} {
		if unix.Fstatat(fd, d, &st, 0) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return false
		}
	}
	return true
}

// gitShaped lists the changes (with a new side) that would lie in a
// directory git takes for a repository once written: one that holds HEAD,
// objects and refs, from the changes or already in the target (has tells
// whether the target holds a path). git run there would read that
// directory's config and hooks as a repository's: a bare repository
// planted in a plain directory, or a hook put in a repository the project
// vendors.
func gitShaped(cs *Changes, has func(p string) (bool, error)) ([]Conflict, error) {
	side := map[string]bool{} // a path the changes leave present (true) or absent
	dirs := map[string]bool{} // directories above what the changes write
	for _, c := range cs.Changes {
		side[c.Path] = c.New != nil
		if c.New != nil {
			for d := path.Dir(c.Path); d != "."; d = path.Dir(d) {
				dirs[d] = true
			}
		}
	}
	present := func(p string) (bool, error) {
		if dirs[p] {
			return true, nil
		}
		if v, ok := side[p]; ok {
			return v, nil
		}
		return has(p)
	}
	known := map[string]bool{}
	isGit := func(d string) (bool, error) {
		if v, ok := known[d]; ok {
			return v, nil
		}
		v := true
		for _, n := range []string{"HEAD", "objects", "refs"} {
			p := n
			if d != "." {
				p = d + "/" + n
			}
			ok, err := present(p)
			if err != nil {
				return false, err
			}
			if !ok {
				v = false
				break
			}
		}
		known[d] = v
		return v, nil
	}
	var bad []Conflict
	for _, c := range cs.Changes {
		if c.New == nil || checkName(c.Path) != nil {
			continue
		}
		for d := path.Dir(c.Path); ; d = path.Dir(d) {
			g, err := isGit(d)
			if err != nil {
				return nil, err
			}
			if g {
				where := d + "/"
				if d == "." {
					where = "the target's top"
				}
				bad = append(bad, Conflict{Path: c.Path, Reason: fmt.Sprintf("lies in a directory git takes for a repository (%s would hold HEAD, objects/ and refs/): git run there would read its config and hooks", where)})
				break
			}
			if d == "." {
				break
			}
		}
	}
	return bad, nil
}

// hasBeneath is gitShaped's has for a target open beneath b.
func hasBeneath(b *beneath) func(string) (bool, error) {
	return func(p string) (bool, error) {
		_, err := b.lstat(p)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, os.ErrNotExist):
			return false, nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, ErrSymlink):
			return false, nil // a link on the way: never followed, a conflict of its own
		}
		return false, err
	}
}
