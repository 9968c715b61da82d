//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// templateName is what a job may give as its vmTemplate: the name of a
// directory in the rootfs directory, never a path (no slash, no leading
// dot, so no "..").
var templateName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`) })

// maxTemplateName keeps names well inside a file name's limit.
const maxTemplateName = 128

var _ sandbox.TemplateChecker = (*Backend)(nil)

// roots says which directories may be a sandbox's root filesystem (a
// template) or be bound into one (the operator's tool directories).
type roots struct {
	rootfsDir       string   // Config.RootfsDir, "" for none
	defaultTemplate string   // Config.DefaultTemplate
	sandboxes       string   // the backend's directory, which no root may show
	uids            uidRange // the sandboxes' host ids, which may own none of it
}

// CheckTemplate implements sandbox.TemplateChecker: name must be the name
// of a usable root filesystem in Config.RootfsDir, or the operator's
// Config.DefaultTemplate itself.
func (b *Backend) CheckTemplate(ctx context.Context, name string) error {
	fd, err := b.roots.openTemplate(name)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// openTemplate resolves a template to its root filesystem directory,
// checks it, and returns an O_PATH descriptor of it: the sandbox binds
// that very directory, whatever happens to the path meanwhile. Errors are
// *sandbox.TemplateError.
func (r *roots) openTemplate(name string) (int, error) {
	bad := func(format string, args ...any) (int, error) {
		return -1, &sandbox.TemplateError{Name: name, Reason: fmt.Sprintf(format, args...), Available: r.templateNames()}
	}
	var p string
	switch {
	case name == "":
		return bad("empty")
	case templateName().MatchString(name) && len(name) <= maxTemplateName:
		if r.rootfsDir == "" {
			return bad("no root filesystem directory is configured on this server")
		}
		p = filepath.Join(r.rootfsDir, name)
	case filepath.IsAbs(name) && name == r.defaultTemplate:
		p = name // the operator's own choice, trusted
	default:
		where := "the server's root filesystem directory"
		if r.rootfsDir != "" {
			where = r.rootfsDir
		}
		return bad("must be the name of a root filesystem in %s (lower-case letters, digits, '.', '_' and '-', starting with a letter or digit), not a path", where)
	}
	// The operator may link a name to a directory elsewhere; what counts
	// is where it leads.
	real, err := filepath.EvalSymlinks(p)
	if errors.Is(err, os.ErrNotExist) {
		if p == name {
			return bad("%s does not exist", p)
		}
		return bad("no root filesystem %q in %s", name, r.rootfsDir)
	}
	if err != nil {
		return bad("%v", err)
	}
	if reason := r.forbiddenRoot(real); reason != "" {
		return bad("%s %s", real, reason)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, real, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if errors.Is(err, unix.ENOTDIR) {
		return bad("%s is not a directory; a root filesystem is a directory with bin/sh", real)
	}
	if err != nil {
		return bad("open %s: %v", real, err)
	}
	if err := checkRootfs(fd, real, r.uids); err != nil {
		unix.Close(fd)
		return bad("%v", err)
	}
	return fd, nil
}

// forbiddenRoot says why a directory can never be a template, or "": the
// host's root would show the whole host, and the sandboxes directory (or
// anything above or below it) other jobs' workspaces.
func (r *roots) forbiddenRoot(real string) string {
	within := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	switch {
	case real == "/":
		return "is the host's root directory"
	case within(real, r.sandboxes) || within(r.sandboxes, real):
		return fmt.Sprintf("would show the sandboxes of other jobs (%s)", r.sandboxes)
	}
	return ""
}

// checkRootfs checks the directory open at fd (shown as name in errors):
// owned by root, writable by none of the sandboxes' users (host ids in
// ids), and the same for what it holds at the top (what the sandbox
// binds), with a shell.
func checkRootfs(fd int, name string, ids uidRange) error {
	sandboxID := ids.contains
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if st.Uid != 0 {
		return fmt.Errorf("%s must be owned by root (it is owned by uid %d)", name, st.Uid)
	}
	if st.Mode&0o002 != 0 || (st.Mode&0o020 != 0 && sandboxID(st.Gid)) {
		return fmt.Errorf("%s must not be writable by the sandboxes' users (mode %04o, group %d)", name, st.Mode&0o7777, st.Gid)
	}
	if st.Mode&0o005 != 0o005 {
		return fmt.Errorf("%s must be readable and searchable by all users (mode o+rx): the sandbox's init runs unprivileged", name)
	}
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	dir := os.NewFile(uintptr(dfd), name)
	entries, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for _, e := range entries {
		if slices.Contains(templateSkip[:], e) {
			continue // the sandbox brings its own
		}
		if err := unix.Fstatat(fd, e, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s/%s: %w", name, e, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			continue // a link is resolved inside the sandbox's own root
		}
		if sandboxID(st.Uid) {
			return fmt.Errorf("%s/%s is owned by uid %d, one of the sandboxes' users", name, e, st.Uid)
		}
		if st.Mode&0o002 != 0 || (st.Mode&0o020 != 0 && sandboxID(st.Gid)) {
			return fmt.Errorf("%s/%s must not be writable by the sandboxes' users (mode %04o, group %d)", name, e, st.Mode&0o7777, st.Gid)
		}
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh"} {
		// Resolved as the sandbox will: symlinks stay inside the template.
		shfd, err := unix.Openat2(fd, sh, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
		if err != nil {
			continue
		}
		err = unix.Fstat(shfd, &st)
		unix.Close(shfd)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			return nil
		}
	}
	return fmt.Errorf("%s has no bin/sh or usr/bin/sh: it is not a root filesystem", name)
}

// templateNames lists the names a job may give: the directories (or links
// to directories) in the rootfs directory whose names are valid.
func (r *roots) templateNames() []string {
	if r.rootfsDir == "" {
		return nil
	}
	entries, err := os.ReadDir(r.rootfsDir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if !templateName().MatchString(e.Name()) || len(e.Name()) > maxTemplateName {
			continue
		}
		if st, err := os.Stat(filepath.Join(r.rootfsDir, e.Name())); err == nil && st.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}
