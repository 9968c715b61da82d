package sandboxtest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

var _ sandbox.Archiver = (*FakeInstance)(nil)

// PutArchive implements sandbox.Archiver on the instance's map of files.
func (s *FakeInstance) PutArchive(ctx context.Context, r io.Reader) (sandbox.Unpacked, error) {
	type entry struct {
		p string
		f *fakeFile
	}
	var got []entry
	res, err := sandbox.ReadArchive(ctx, r, func(e sandbox.ArchiveEntry) error {
		f := &fakeFile{mode: fs.FileMode(e.Header.Mode).Perm(), mod: e.Header.ModTime}
		switch e.Header.Typeflag {
		case tar.TypeDir:
			f.mode |= fs.ModeDir
		case tar.TypeSymlink:
			f.mode, f.data = fs.ModeSymlink|0o777, []byte(e.Header.Linkname)
		default:
			data, err := io.ReadAll(e.Body)
			if err != nil {
				return fmt.Errorf("%w: %w", sandbox.ErrBadArchive, err)
			}
			f.data = data
		}
		got = append(got, entry{path.Join(delegate.Workspace, e.Name), f})
		return nil
	})
	if err != nil {
		return res, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return res, sandbox.ErrGone
	}
	// All or nothing: the archive was read whole first. What the
	// workspace holds already must not lead a name astray either.
	for _, e := range got {
		for d := path.Dir(e.p); d != delegate.Workspace; d = path.Dir(d) {
			if f, ok := s.files[d]; ok && !f.mode.IsDir() {
				return res, fmt.Errorf("%w: %s lies under %s, which is not a directory", sandbox.ErrBadArchive, e.p, d)
			}
		}
	}
	for _, e := range got {
		for d := path.Dir(e.p); d != delegate.Workspace; d = path.Dir(d) {
			if _, ok := s.files[d]; !ok {
				s.files[d] = &fakeFile{mode: fs.ModeDir | 0o755, mod: e.f.mod}
			}
		}
		s.files[e.p] = e.f
	}
	return res, nil
}

// GetArchive implements sandbox.Archiver: the files as a tar stream.
func (s *FakeInstance) GetArchive(ctx context.Context) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil, sandbox.ErrGone
	}
	names := make([]string, 0, len(s.files))
	for p := range s.files {
		names = append(names, p)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		f := s.files[p]
		hdr := &tar.Header{Name: strings.TrimPrefix(p, delegate.Workspace+"/"), Mode: int64(f.mode.Perm()), ModTime: f.mod, Format: tar.FormatPAX}
		switch {
		case f.mode.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case f.mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(f.data)
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			tw.Write(f.data)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return io.NopCloser(&buf), nil
}

// Remove deletes a file as a command would.
func (s *FakeInstance) Remove(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.files, p)
}
