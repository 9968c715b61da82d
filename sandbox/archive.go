package sandbox

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ErrBadArchive: a tar stream PutArchive refuses (not tar, or an entry
// whose name is absolute, climbs out with .., is not clean, or lies under
// a link or a file of the archive).
var ErrBadArchive = errors.New("bad archive")

// ArchiveEntry is one entry ReadArchive keeps: its clean name relative to
// /workspace, and for a regular file its content (read it before the
// next entry).
type ArchiveEntry struct {
	Name   string
	Header *tar.Header
	Body   io.Reader
}

// ReadArchive reads a tar stream (gzip or not: the first bytes tell) as
// PutArchive must take it, for the backends that do not unpack it
// themselves on the host: it checks every name (relative, clean, not
// under a link or a file the archive made), counts what would be written,
// lists what is skipped (special files, hard links) and calls visit, if
// set, with each directory, file and link in order. It stops at the first
// bad entry, with an error naming it.
func ReadArchive(ctx context.Context, r io.Reader, visit func(ArchiveEntry) error) (Unpacked, error) {
	var res Unpacked
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return res, fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		src = gz
	}
	tr := tar.NewReader(src)
	// Entries that are not directories: nothing may lie under them.
	notDir := map[string]bool{}
	for n := 0; ; n++ {
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("%w: %w", ErrBadArchive, err)
		}
		name, err := archiveName(hdr.Name)
		if err != nil {
			return res, err
		}
		if name == "" {
			continue
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if notDir[d] {
				return res, fmt.Errorf("%w: entry %q lies under %s, which is not a directory of the archive", ErrBadArchive, hdr.Name, d)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			delete(notDir, name)
			res.Dirs++
		case tar.TypeReg, tar.TypeRegA, tar.TypeSymlink:
			notDir[name] = true
			res.Files++
			if hdr.Typeflag != tar.TypeSymlink {
				res.Bytes += hdr.Size
			}
		case tar.TypeLink:
			res.Skipped = append(res.Skipped, name+": a hard link")
			continue
		default:
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: a special file (tar type %q)", name, hdr.Typeflag))
			continue
		}
		if visit != nil {
			if err := visit(ArchiveEntry{Name: name, Header: hdr, Body: tr}); err != nil {
				return res, err
			}
		}
	}
}

// archiveName is an entry's clean relative name ("" for the top), or an
// error naming the rule it breaks.
func archiveName(raw string) (string, error) {
	name := raw
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	name = strings.TrimSuffix(name, "/")
	switch {
	case name == "" || name == ".":
		return "", nil
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: entry %q is an absolute path", ErrBadArchive, raw)
	case strings.ContainsRune(name, 0) || path.Clean(name) != name:
		return "", fmt.Errorf("%w: entry %q is not a clean relative path", ErrBadArchive, raw)
	case name == ".." || strings.HasPrefix(name, "../"):
		return "", fmt.Errorf("%w: entry %q leaves the workspace", ErrBadArchive, raw)
	}
	return name, nil
}
