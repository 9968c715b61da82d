package proxmox

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

var _ sandbox.Archiver = (*vmSandbox)(nil)

// maxArchiveParts bounds the parts of one archive (their names have four
// digits): about 450 MB compressed.
const maxArchiveParts = 10000

// unpackScript joins an archive's parts ($0.p0000...) into $0 and unpacks
// it into the workspace, keeping permissions (-p, also for a non-root
// agent) and modification times to the nanosecond (GNU tar reads them
// from the pax headers), owned by the agent's user. The archive was
// checked and rewritten by the server: names clean and relative, no
// special files, no hard links. A constant: the path is an argument.
const unpackScript = `b=$0; cat -- "$b".p[0-9][0-9][0-9][0-9] >"$b" && rm -f -- "$b".p[0-9][0-9][0-9][0-9] && mkdir -p -- ` + workspace + ` &&
tar -x -z -p -f "$b" -C ` + workspace + ` --no-same-owner --delay-directory-restore --warning=no-timestamp; rc=$?; rm -f -- "$b" "$b".p[0-9][0-9][0-9][0-9]; exit $rc`

// packScript writes the workspace as a gzip pax tar to $0 (pax keeps the
// nanoseconds of modification times, GNU tar's own format does not):
// hard links as the files they link to, without git's objects (never
// changes) nor the simulator's agent directory (.qga, pvesim/doc.go).
// Exit status 1 is GNU tar's "a file changed as it was read", which a
// background process of a kept sandbox may cause: the archive is still
// whole.
const packScript = `umask 077; mkdir -p -- "${0%/*}" && tar -c -z -f "$0" --format=posix -C ` + workspace + ` --hard-dereference --exclude=./.git/objects --exclude=./.qga --warning=no-file-ignored .`

// PutArchive implements sandbox.Archiver: the stream is checked and
// rewritten (sandbox.ReadArchive: what breaks a rule fails here, special
// files and hard links are left out), gzipped, written into the guest in
// parts through agent/file-write, and unpacked there by GNU tar in one
// agent/exec.
func (s *vmSandbox) PutArchive(ctx context.Context, r io.Reader) (sandbox.Unpacked, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	base := guestDir + "/ws-" + hex.EncodeToString(nonce[:])
	pw := &partWriter{ctx: ctx, s: s, base: base}
	zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	res, err := sandbox.ReadArchive(ctx, r, func(e sandbox.ArchiveEntry) error {
		h := e.Header
		hdr := &tar.Header{Name: e.Name, Typeflag: h.Typeflag, Mode: h.Mode & 0o777, ModTime: h.ModTime, Format: tar.FormatPAX}
		switch h.Typeflag {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeSymlink:
			hdr.Linkname = h.Linkname
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, h.Size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, e.Body); err != nil {
				return fmt.Errorf("%s: %w", e.Name, err)
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = pw.flush()
	}
	if err != nil {
		if pw.n > 0 {
			s.run(context.WithoutCancel(ctx), []string{"/bin/sh", "-c", `rm -f -- "$0".p[0-9][0-9][0-9][0-9]`, base})
		}
		return res, fmt.Errorf("put archive in VM %d: %w", s.vmid, err)
	}
	if _, err := s.runOK(ctx, []string{"/bin/sh", "-c", unpackScript, base}); err != nil {
		return res, fmt.Errorf("put archive in VM %d: %w", s.vmid, err)
	}
	return res, nil
}

// partWriter writes what it is given into the guest in parts of
// pve.MaxFileWrite bytes, base.p0000, base.p0001...
type partWriter struct {
	ctx  context.Context
	s    *vmSandbox
	base string
	buf  []byte
	n    int // parts written
}

func (w *partWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for len(w.buf) >= pve.MaxFileWrite {
		if err := w.part(w.buf[:pve.MaxFileWrite]); err != nil {
			return 0, err
		}
		w.buf = append(w.buf[:0], w.buf[pve.MaxFileWrite:]...)
	}
	return len(p), nil
}

func (w *partWriter) flush() error {
	if len(w.buf) > 0 || w.n == 0 {
		return w.part(w.buf)
	}
	return nil
}

func (w *partWriter) part(data []byte) error {
	if w.n == maxArchiveParts {
		return fmt.Errorf("the archive is over %d MB compressed", maxArchiveParts*pve.MaxFileWrite/1000000)
	}
	name := fmt.Sprintf("%s.p%04d", w.base, w.n)
	if err := w.s.writeParts(w.ctx, data, func(int) string { return name }); err != nil {
		return err
	}
	w.n++
	return nil
}

// GetArchive implements sandbox.Archiver: tar packs the workspace into a
// file of guestDir, which is read back with agent/file-read (16 MiB) and
// then dd through agent/exec, 16 MiB at a time; Close removes it.
func (s *vmSandbox) GetArchive(ctx context.Context) (io.ReadCloser, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	name := guestDir + "/out-" + hex.EncodeToString(nonce[:]) + ".tgz"
	r, err := s.run(ctx, []string{"/bin/sh", "-c", packScript, name})
	if err == nil && r.code != 0 && r.code != 1 {
		err = fmt.Errorf("tar exited %d: %s", r.code, r.stderr)
	}
	if err != nil {
		s.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", name})
		return nil, fmt.Errorf("get archive from VM %d: %w", s.vmid, err)
	}
	return &guestFile{ctx: ctx, s: s, name: name}, nil
}

// guestFile reads a file of the guest from start to end.
type guestFile struct {
	ctx  context.Context
	s    *vmSandbox
	name string
	off  int64
	buf  []byte
	eof  bool
}

func (f *guestFile) Read(p []byte) (int, error) {
	for len(f.buf) == 0 {
		if f.eof {
			return 0, io.EOF
		}
		if err := f.fetch(); err != nil {
			return 0, err
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}

// fetch reads the next 16 MiB: the first through agent/file-read, the
// others through dd (file-read has no offset).
func (f *guestFile) fetch() error {
	if f.off == 0 {
		var fc pve.FileContent
		err := f.s.onNode(f.ctx, func(node string) (err error) {
			fc, err = f.s.b.c.AgentFileRead(f.ctx, node, f.s.vmid, f.name)
			return err
		})
		if err != nil {
			return fmt.Errorf("read %s in VM %d: %w", f.name, f.s.vmid, err)
		}
		f.buf, f.eof = fc.Data, !fc.Truncated
	} else {
		out, err := f.s.runOK(f.ctx, []string{"/bin/dd", "if=" + f.name, "iflag=skip_bytes,count_bytes",
			"skip=" + strconv.FormatInt(f.off, 10), "count=" + strconv.Itoa(pve.MaxFileRead), "status=none"})
		if err != nil {
			return fmt.Errorf("read %s in VM %d: %w", f.name, f.s.vmid, err)
		}
		f.buf, f.eof = out, len(out) < pve.MaxFileRead
	}
	f.off += int64(len(f.buf))
	return nil
}

func (f *guestFile) Close() error {
	_, err := f.s.runOK(context.WithoutCancel(f.ctx), []string{"/bin/rm", "-f", "--", f.name})
	return err
}
