package workspace

import (
	"errors"
	"fmt"
	"strings"
)

// The errors this package returns wrap one of these, so that a caller can
// tell bad input (a field error for the user) from a failure of its own
// with errors.Is. doc.go maps them to the manifest's fields.
var (
	// ErrNotAbsolute: a directory given as a relative path.
	ErrNotAbsolute = errors.New("not an absolute path")
	// ErrNotDirectory: the source (or target) is not a directory.
	ErrNotDirectory = errors.New("not a directory")
	// ErrOutside: a path that leaves the directory it must stay in (the
	// allowed root, the tree, the target).
	ErrOutside = errors.New("outside the directory")
	// ErrSymlink: a symbolic link where the path needs a directory or a
	// file (never followed), or a loop.
	ErrSymlink = errors.New("a symbolic link is in the way (links are never followed)")
	// ErrGitDir: a source or target that is a git directory or lies in
	// one (a job's files there would be a repository's hooks and
	// configuration, which git runs as the repository's owner).
	ErrGitDir = errors.New("a git directory, or inside one (a job's changes there would be hooks and configuration git runs)")
	// ErrOtherFilesystem: a mount point inside the tree (never crossed).
	ErrOtherFilesystem = errors.New("on another filesystem (mount points are not crossed)")
	// ErrOverCap: a tree (or its changes) over a cap; see *CapError.
	ErrOverCap = errors.New("over the cap")
	// ErrChanged: the source changed while it was copied; see
	// *ChangedError. Copying again later gives a consistent copy.
	ErrChanged = errors.New("changed while it was copied")
	// ErrConflict: Apply found the target changed since the import; see
	// *ConflictError.
	ErrConflict = errors.New("changed in the target since the import")
	// ErrRefused: changes that Apply (or Extract) refuses to write: a
	// symbolic link, a setuid or setgid mode, a path out of the target.
	ErrRefused = errors.New("refused")
	// ErrBadArchive: a tar stream this package cannot read, or one with
	// a name that is absolute, climbs out with "..", or is not clean.
	ErrBadArchive = errors.New("bad archive")
	// ErrBadURL: a git URL that is not https, or carries credentials.
	ErrBadURL = errors.New("bad git URL")
	// ErrUnknownRef: no branch, tag or commit of that name at the remote.
	ErrUnknownRef = errors.New("unknown ref")
	// ErrAddressRefused: the address policy refused the address a git
	// host resolved to (loopback, link-local, private, this host's own).
	ErrAddressRefused = errors.New("address refused by the policy")
	// ErrNoBaseCommit: a branch was asked for, but the import had no
	// commit to build on (not a git work tree, or no commit yet).
	ErrNoBaseCommit = errors.New("no base commit")
)

// CapError is a tree over one of its caps, with what was found.
type CapError struct {
	What  string // "bytes" or "files"
	Found int64  // what the scan counted (at least this many when More)
	Cap   int64
	More  bool // the scan stopped counting at Found
}

func (e *CapError) Error() string {
	more := ""
	if e.More {
		more = "more than "
	}
	if e.What == "bytes" {
		return fmt.Sprintf("%s%s found, over the cap of %s", more, mib(e.Found), mib(e.Cap))
	}
	return fmt.Sprintf("%s%d %s found, over the cap of %d", more, e.Found, e.What, e.Cap)
}

func (e *CapError) Unwrap() error { return ErrOverCap }

func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// ChangedError names a path that changed while it was read.
type ChangedError struct {
	Path string
	What string // what differed: "size 10 -> 12", "replaced by a link"…
}

func (e *ChangedError) Error() string {
	return fmt.Sprintf("%s %s (%s); copy it again once it is still", e.Path, ErrChanged, e.What)
}

func (e *ChangedError) Unwrap() error { return ErrChanged }

// Conflict is one path that Apply would not write.
type Conflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// ConflictError lists every path whose target changed since the import.
// Nothing was written.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%d path(s) %s, nothing written: %s", len(e.Conflicts), ErrConflict, listConflicts(e.Conflicts))
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// RefusedError lists the changes Apply refuses to write. Nothing was
// written.
type RefusedError struct {
	Conflicts []Conflict
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%d change(s) %s, nothing written: %s", len(e.Conflicts), ErrRefused, listConflicts(e.Conflicts))
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// NotShownError lists the changes the diff names without showing their
// content (binary, too large, past the diff's cap; see NotShown), which
// are written only when asked (ApplyOptions.Binary, BranchOptions.Binary).
// Nothing was written.
type NotShownError struct {
	Changes []Conflict
}

func (e *NotShownError) Error() string {
	return fmt.Sprintf("%d change(s) the diff lists without showing %s (written only when asked), nothing written: %s", len(e.Changes), ErrRefused, listConflicts(e.Changes))
}

func (e *NotShownError) Unwrap() error { return ErrRefused }

func listConflicts(cs []Conflict) string {
	var b strings.Builder
	for i, c := range cs {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(cs)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", quoteName(c.Path), c.Reason)
	}
	return b.String()
}
