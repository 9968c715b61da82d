//go:build unix

package workspace

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"
)

// ExtractOptions are Extract's options; the zero value takes the defaults.
type ExtractOptions struct {
	MaxBytes int64 // DefaultMaxBytes when 0
	MaxFiles int   // DefaultMaxFiles when 0
}

// Extracted says what Extract wrote.
type Extracted struct {
	Files, Dirs int
	Bytes       int64
	Skipped     []Skipped // special files, hard links: not written
}

// Extract unpacks a tar stream (gzip or not: it tells by the first bytes)
// into dir, an existing directory, as dir's owner: the other half of
// Archive, for a backend that fills a sandbox's /workspace from the host.
// Names must be relative and clean (a leading "./" is allowed) and nothing
// is written through a link: a name under a link the archive made fails.
// Modes keep their permission bits only; modification times are kept.
// Special files and hard links are skipped and listed.
func Extract(ctx context.Context, r io.Reader, dir string, opts ExtractOptions) (*Extracted, error) {
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxFiles == 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	rootfd, st, err := openRoot(dir, "")
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	id, err := identityFor(st.Uid, st.Gid)
	if err != nil {
		return nil, err
	}
	tr, err := tarReader(r)
	if err != nil {
		return nil, err
	}
	res := &Extracted{}
	err = runAs(id, func() error {
		fd, err := reopenAs(rootfd, dir)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		b := newBeneath(fd)
		defer b.close()
		// The umask of the moment: read once for the whole tree.
		if mask, ok := processUmask(); ok && emptyWithoutACL(fd) {
			b.plainModes, b.umask = true, mask
		}
		type dirMode struct {
			path  string
			perm  uint32
			mtime int64
		}
		var dirs []dirMode
		n := 0
		// made is the parent directory made (or found) last: the
		// entries of one directory come together.
		made := ""
		for {
			if n&255 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return fmt.Errorf("%w: %w", ErrBadArchive, err)
			}
			name, err := archiveName(hdr)
			if err != nil {
				return err
			}
			if name == "" {
				continue
			}
			n++
			if n > opts.MaxFiles {
				return &CapError{What: "files", Found: int64(n), Cap: int64(opts.MaxFiles), More: true}
			}
			parent, _ := splitParent(name)
			switch hdr.Typeflag {
			case tar.TypeDir:
				// Made writable for now; its own mode comes at the end.
				if err := b.mkdirAll(name, 0o700); err != nil {
					return err
				}
				dirs = append(dirs, dirMode{name, uint32(hdr.Mode) & 0o777, hdr.ModTime.UnixNano()})
				res.Dirs++
			case tar.TypeReg, tar.TypeRegA:
				res.Bytes += hdr.Size
				if res.Bytes > opts.MaxBytes {
					return &CapError{What: "bytes", Found: res.Bytes, Cap: opts.MaxBytes, More: true}
				}
				if parent != made {
					if err := b.mkdirAll(parent, 0o755); err != nil {
						return err
					}
					made = parent
				}
				if err := b.createFile(name, tr, uint32(hdr.Mode)&0o777, hdr.ModTime.UnixNano(), false); err != nil {
					return err
				}
				res.Files++
			case tar.TypeSymlink:
				if err := b.mkdirAll(parent, 0o755); err != nil {
					return err
				}
				if err := b.symlink(name, hdr.Linkname, hdr.ModTime.UnixNano()); err != nil {
					return err
				}
				res.Files++
			case tar.TypeLink:
				res.Skipped = append(res.Skipped, Skipped{Path: name, Reason: "a hard link (to " + hdr.Linkname + ")"})
			default:
				res.Skipped = append(res.Skipped, Skipped{Path: name, Reason: fmt.Sprintf("a special file (tar type %q)", hdr.Typeflag)})
			}
		}
		// Directories' modes and times last: writing into them changed
		// their times, and a read-only one had to be writable till now.
		for i := len(dirs) - 1; i >= 0; i-- {
			d := dirs[i]
			if err := b.chmod(d.path, d.perm); err != nil {
				return err
			}
			if err := b.setTimes(d.path, d.mtime); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// tarReader reads a tar stream, gunzipping it first if it starts with
// gzip's magic number.
func tarReader(r io.Reader) (*tarIn, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic, err := br.Peek(2)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrBadArchive, err)
	}
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		return newTarIn(bufio.NewReaderSize(gz, 64<<10)), nil
	}
	return newTarIn(br), nil
}

// archiveName returns an entry's clean relative name ("" for the root
// itself), or an error if it is absolute, climbs out or is not clean.
func archiveName(hdr *tar.Header) (string, error) {
	name := hdr.Name
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	name = strings.TrimSuffix(name, "/")
	if name == "" || name == "." {
		return "", nil
	}
	if err := checkName(name); err != nil {
		return "", fmt.Errorf("%w: entry %q: %w", ErrBadArchive, hdr.Name, err)
	}
	return name, nil
}
