package workspace

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// Baseline is a tree as it was imported: per path (outside .git) its type,
// mode, size, modification time, link target and sha256. The engine keeps
// it (it is plain JSON) for as long as the job's changes can be asked for:
// it is what the changes are computed against and what Apply checks the
// target against.
type Baseline struct {
	Version int  `json:"version"`
	Kind    Kind `json:"kind"`
	// Head and Branch: the commit and branch checked out at the import (a
	// git work tree); a branch of the changes is built on Head.
	Head   string `json:"head,omitempty"`
	Branch string `json:"branch,omitempty"`
	// IncludeIgnored: ignored files were imported, so files the job adds
	// that git would ignore count as changes too.
	IncludeIgnored bool        `json:"includeIgnored,omitempty"`
	Files          []FileState `json:"files"`
}

// BaselineVersion is the Version this package writes and reads.
const BaselineVersion = 1

// FileState is one file or symbolic link of a baseline.
type FileState struct {
	Path   string `json:"path"`
	Type   Type   `json:"type"`
	Mode   Mode   `json:"mode"`
	Size   int64  `json:"size"`
	MTime  int64  `json:"mtime"` // Unix nanoseconds
	Target string `json:"target,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// Check says what is wrong with a baseline read back from storage.
func (b *Baseline) Check() error {
	if b == nil {
		return fmt.Errorf("baseline: missing")
	}
	if b.Version != BaselineVersion {
		return fmt.Errorf("baseline: version %d, this reads %d", b.Version, BaselineVersion)
	}
	for _, f := range b.Files {
		if err := checkName(f.Path); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
	}
	return nil
}

func (b *Baseline) byPath() map[string]*FileState {
	m := make(map[string]*FileState, len(b.Files))
	for i := range b.Files {
		m[b.Files[i].Path] = &b.Files[i]
	}
	return m
}

// Mode is a permission mode, written as octal text ("0644") in JSON.
type Mode fs.FileMode

func (m Mode) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%04o", uint32(m)&0o7777)), nil
}

func (m *Mode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 8, 32)
	if err != nil || v > 0o7777 {
		return fmt.Errorf("mode %q: want octal permission bits like 0644", b)
	}
	*m = Mode(v)
	return nil
}

// Exec tells whether any execute bit is set: all git records of a mode.
func (m Mode) Exec() bool { return m&0o111 != 0 }

func (t Type) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

func (t *Type) UnmarshalText(b []byte) error {
	switch string(b) {
	case "file":
		*t = TypeFile
	case "dir":
		*t = TypeDir
	case "symlink":
		*t = TypeSymlink
	default:
		return fmt.Errorf("type %q: want file, dir or symlink", b)
	}
	return nil
}

// inGit tells whether a path is a .git directory or under one: never part
// of a baseline or of the changes (a job must not be able to plant hooks
// or configuration that run on the user's machine).
func inGit(p string) bool {
	if !strings.ContainsAny(p, "gG") {
		return false // gitName needs one: the common case, every file of an import
	}
	for p != "" {
		c, rest, _ := strings.Cut(p, "/")
		if gitName(c) {
			return true
		}
		p = rest
	}
	return false
}

// gitName tells whether a path component names a .git directory on a
// filesystem the changes may be written to, as git's own verify_path
// reads one: case-folded (macOS, Windows), without the code points HFS+
// ignores, and as NTFS reads it (trailing dots and spaces dropped, a
// ":stream" suffix, the short name GIT~1).
func gitName(c string) bool {
	if !strings.ContainsAny(c, "gG") {
		return false
	}
	c = strings.Map(func(r rune) rune {
		switch {
		case r >= 0x200c && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x206a && r <= 0x206f, r == 0xfeff:
			return -1 // ignored by HFS+ (git's utf8.c, next_hfs_char)
		}
		return r
	}, c)
	c, _, _ = strings.Cut(c, ":")
	c = strings.TrimRight(c, ". ")
	return strings.EqualFold(c, ".git") || strings.EqualFold(c, "git~1")
}

// unrecorded tells whether a path is never part of a baseline or of the
// changes: in a .git directory (inGit), or delegate's own directory in
// the workspace (/workspace/.delegate: the answers to a job's questions,
// see engine.AnswersDir), which is not the job's work.
func unrecorded(p string) bool {
	return inGit(p) || p == ".delegate" || strings.HasPrefix(p, ".delegate/")
}

// checkName checks a relative path read from an archive or a stored
// value: clean, relative, no "..", no empty or "." component, no NUL.
func checkName(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q: %w", p, ErrOutside)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("path %q: %w", p, ErrOutside)
		}
	}
	return nil
}
