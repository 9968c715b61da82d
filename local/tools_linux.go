//go:build linux

package local

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// What a job sees of the host's tools (host view, no template): the
// host's /usr, /bin, /sbin, /lib* and /etc read-only (so /usr/local/bin
// too: whatever the host installed there runs, without the host's state
// or sockets), the operator's tool directories (Config.ToolDirs) bound
// read-only at their own paths, and a PATH that finds both: the standard
// one, then the toolchains installed where they are usually put, then the
// tool directories.

// toolchainBins are toolchains' bin directories that installers put
// outside the standard PATH, added to a job's PATH when its root has them
// (the Go tarball's /usr/local/go, rustup's and the official images'
// /usr/local/cargo).
var toolchainBins = sandbox.ToolchainBins

// providedTops are the top directories the sandbox makes itself: a tool
// directory may not be under them.
var providedTops = [...]string{"workspace", "tmp", "proc", "dev", "run", "sys"}

// checkToolDirs checks the operator's tool directories: clean absolute
// paths of directories that every user can reach (the sandbox's init,
// which binds them, is unprivileged), not "/", the sandboxes directory or
// anything above or under it, not under a directory the sandbox makes
// itself, not writable by all nor owned by the sandboxes' users, and no
// symbolic link on the way (the path is bound as it is named).
func (r *roots) checkToolDirs(dirs []string) error {
	for _, d := range dirs {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d {
			return fmt.Errorf("tool directory %q: must be a clean absolute path", d)
		}
		if why := r.forbiddenRoot(d); why != "" {
			return fmt.Errorf("tool directory %q: %s", d, why)
		}
		top := strings.Split(strings.TrimPrefix(d, "/"), "/")[0]
		if slices.Contains(providedTops[:], top) {
			return fmt.Errorf("tool directory %q: the sandbox has its own /%s", d, top)
		}
		if real, err := filepath.EvalSymlinks(d); err != nil {
			return fmt.Errorf("tool directory %q: %w", d, err)
		} else if real != d {
			return fmt.Errorf("tool directory %q: is a link or under one (give the real path, %s)", d, real)
		}
		for p := d; ; p = filepath.Dir(p) {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return fmt.Errorf("tool directory %q: %s: %w", d, p, err)
			}
			switch {
			case p == d && st.Mode&unix.S_IFMT != unix.S_IFDIR:
				return fmt.Errorf("tool directory %q: not a directory", d)
			case p == d && st.Mode&0o005 != 0o005:
				return fmt.Errorf("tool directory %q: must be readable and searchable by all users (mode o+rx)", d)
			case p != d && st.Mode&0o001 == 0:
				return fmt.Errorf("tool directory %q: %s must be searchable by all users (mode o+x): the sandbox's init is unprivileged", d, p)
			case p == d && (st.Mode&0o002 != 0 || r.uids.contains(st.Uid)):
				return fmt.Errorf("tool directory %q: must be writable by neither all users nor the sandboxes' (mode %04o, owner %d)", d, st.Mode&0o7777, st.Uid)
			}
			if p == "/" {
				break
			}
		}
	}
	return nil
}

// toolDirOps bind the tool directories that the host view does not show
// already into the root being built under root.
func toolDirOps(dirs []string, add func(code opCode, n uint64, label string, s ...string), at func(p ...string) string) {
	for _, d := range dirs {
		parts := strings.Split(strings.TrimPrefix(d, "/"), "/")
		if slices.Contains(hostViewDirs[:], parts[0]) {
			continue // visible already, and read-only: only on PATH
		}
		for i := range parts {
			add(opMkdir, 0o755, "tool directory "+d, at(parts[:i+1]...))
		}
		add(opMount, unix.MS_BIND|unix.MS_REC, "tool directory: bind "+d, d, at(parts...))
		add(opReadOnly, 0, "tool directory: make "+d+" read-only", at(parts...))
	}
}

// standardPath is the PATH of a job whose environment asks for the standard
// one: the toolchains its root has, then the tool directories (each its
// bin directory when it has one). root is where the server sees the
// job's root ("/" for the host view). A PATH the job chose is its own.
func standardPath(env []string, root string, toolDirs []string) []string {
	i := slices.Index(env, "PATH="+sandbox.DefaultPath)
	if i < 0 {
		return env
	}
	dirs := strings.Split(sandbox.DefaultPath, ":")
	isDir := func(p string) bool {
		fi, err := os.Stat(filepath.Join(root, p))
		return err == nil && fi.IsDir()
	}
	add := func(p string) {
		if !slices.Contains(dirs, p) {
			dirs = append(dirs, p)
		}
	}
	for _, p := range toolchainBins {
		if isDir(p) {
			add(p)
		}
	}
	if root == "/" {
		for _, d := range toolDirs {
			if isDir(filepath.Join(d, "bin")) {
				d = filepath.Join(d, "bin")
			}
			add(d)
		}
	}
	env = slices.Clone(env)
	env[i] = "PATH=" + strings.Join(dirs, ":")
	return env
}
