//go:build unix

package workspace

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"

	"golang.org/x/sys/unix"
)

// ArchiveOptions are Archive's options.
type ArchiveOptions struct {
	// Gzip compresses the stream (level 1: source code shrinks several
	// times over at little cost), for a stream that crosses a slow link
	// such as the Proxmox guest agent.
	Gzip bool
	// NoBaseline skips the sha256 of every file: for reading a tree back
	// from a sandbox, where only the stream is wanted.
	NoBaseline bool

	// afterRead, if set (tests), runs after a file's data was read and
	// before it is checked again.
	afterRead func(path string)
}

// Archive writes the tree Scan found to w as a tar stream (PAX, with
// nanosecond modification times; owners are not kept; setuid, setgid and
// sticky bits are dropped), reading every file beneath the root without
// following links, as the root's owner. It returns the baseline of what it
// wrote. Each file is checked against what Scan saw when it is opened and
// again after it is read (inode, size, modification and change times): a
// file that differs gives a *ChangedError and the stream written so far
// must be thrown away. A consistent copy or a consistent error, then; a
// file rewritten with the same size within the filesystem's timestamp
// granularity (a few milliseconds) of its last change cannot be told
// from an unchanged one, as for git itself.
func (t *Tree) Archive(ctx context.Context, w io.Writer, opts ArchiveOptions) (*Baseline, error) {
	rootfd, st, err := openRoot(t.Root, t.within)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	if int64(st.Dev) != t.dev || int64(st.Ino) != t.ino {
		return nil, &ChangedError{Path: t.Root, What: "the directory was replaced since it was scanned"}
	}
	id, err := identityFor(t.owner, t.ownerGid)
	if err != nil {
		return nil, err
	}
	base := &Baseline{Version: BaselineVersion, Kind: t.Kind, Head: t.Head, Branch: t.Branch, IncludeIgnored: t.IncludeIgnored}
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, t.Root)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		a := &archiver{t: t, b: newBeneath(fd), opts: opts, buf: make([]byte, 256<<10), h: sha256.New(), base: base}
		defer a.b.close()
		bw := bufio.NewWriterSize(w, 256<<10)
		var out io.Writer = bw
		var gz *gzip.Writer
		if opts.Gzip {
			gz, _ = gzip.NewWriterLevel(bw, gzip.BestSpeed)
			out = gz
		}
		a.tw = newTarWriter(out)
		for i := range t.Entries {
			if i&255 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if err := a.entry(&t.Entries[i]); err != nil {
				return err
			}
		}
		if err := a.tw.Close(); err != nil {
			return err
		}
		if gz != nil {
			if err := gz.Close(); err != nil {
				return err
			}
		}
		return bw.Flush()
	})
	if err != nil {
		return nil, err
	}
	return base, nil
}

type archiver struct {
	t    *Tree
	b    *beneath
	tw   *tarWriter
	opts ArchiveOptions
	buf  []byte
	h    hash.Hash
	base *Baseline
}

func (a *archiver) entry(e *Entry) error {
	keep := !unrecorded(e.Path) && !a.opts.NoBaseline
	switch e.Type {
	case TypeDir:
		return a.tw.header(e.Path+"/", tarDir, int64(e.Perm), 0, e.MTime, "")
	case TypeSymlink:
		target, err := a.b.readlink(e.Path)
		if err != nil {
			return changedOr(e.Path, err)
		}
		if target != e.Target {
			return &ChangedError{Path: e.Path, What: "the link was changed"}
		}
		if keep {
			a.base.Files = append(a.base.Files, FileState{Path: e.Path, Type: TypeSymlink, Mode: Mode(e.Perm), MTime: e.MTime, Target: target})
		}
		return a.tw.header(e.Path, tarSymlink, int64(e.Perm), 0, e.MTime, target)
	}
	fd, st, err := a.b.open(e.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return changedOr(e.Path, err)
	}
	defer unix.Close(fd)
	if what := differs(e, st); what != "" {
		return &ChangedError{Path: e.Path, What: what}
	}
	if err := a.tw.header(e.Path, tarReg, int64(e.Perm), e.Size, e.MTime, ""); err != nil {
		return err
	}
	a.h.Reset()
	for left := e.Size; left > 0; {
		n := int64(len(a.buf))
		if left < n {
			n = left
		}
		m, err := unix.Read(fd, a.buf[:n])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pathErr("read", e.Path, err)
		}
		if m == 0 {
			return &ChangedError{Path: e.Path, What: fmt.Sprintf("shrank below %d bytes while it was read", e.Size)}
		}
		if keep {
			a.h.Write(a.buf[:m])
		}
		if _, err := a.tw.Write(a.buf[:m]); err != nil {
			return err
		}
		left -= int64(m)
	}
	if a.opts.afterRead != nil {
		a.opts.afterRead(e.Path)
	}
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return pathErr("stat", e.Path, err)
	}
	if what := differs(e, &after); what != "" {
		return &ChangedError{Path: e.Path, What: what + " while it was read"}
	}
	if keep {
		a.base.Files = append(a.base.Files, FileState{Path: e.Path, Type: TypeFile, Mode: Mode(e.Perm), Size: e.Size, MTime: e.MTime, SHA256: hex.EncodeToString(a.h.Sum(nil))})
	}
	return nil
}

// differs says how an open file differs from its entry ("" if not).
func differs(e *Entry, st *unix.Stat_t) string {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return "no longer a regular file"
	case int64(st.Ino) != e.ino:
		return "replaced by another file"
	case st.Size != e.Size:
		return fmt.Sprintf("size %d -> %d", e.Size, st.Size)
	case st.Mtim.Nano() != e.MTime:
		return "modified"
	case st.Ctim.Nano() != e.ctime:
		return "its status changed"
	}
	return ""
}

// changedOr turns what a path swapped since the scan gives (gone, a link
// or a directory now) into a *ChangedError.
func changedOr(p string, err error) error {
	switch {
	case isErrno(err, unix.ENOENT):
		return &ChangedError{Path: p, What: "removed"}
	case isErrno(err, unix.ELOOP):
		return &ChangedError{Path: p, What: "replaced by a symbolic link (not followed)"}
	case isErrno(err, unix.ENOTDIR), isErrno(err, unix.EISDIR), isErrno(err, unix.EINVAL):
		return &ChangedError{Path: p, What: "replaced"}
	}
	return err
}
