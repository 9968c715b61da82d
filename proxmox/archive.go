package proxmox

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

var _ sandbox.Archiver = (*vmSandbox)(nil)

// maxArchiveParts bounds the parts of one archive (their names have four
// digits): about 450 MB compressed.
const maxArchiveParts = 10000

// xferPrefix names delegate's files in the workspace while they travel:
// the archive going in (in parts through the agent, or whole over HTTP)
// and the workspace packed to go out. They are on the workspace's own
// file system, the VM's disk, for the length of the call: not in /tmp,
// which is RAM on Debian 13 (a tmpfs of half the VM's memory), where a
// 100 MB archive would take 100 MB of the job's memory or not fit. The
// workspace needs the room anyway, and packScript leaves them out.
const xferPrefix = workspace + "/.delegate-xfer-"

// xferName is a new name of xferPrefix.
func xferName(suffix string) string {
	var nonce [8]byte
	rand.Read(nonce[:])
	return xferPrefix + hex.EncodeToString(nonce[:]) + suffix
}

// unpackScript unpacks the archive $0 into the workspace, reading its
// parts ($0.p0000...) in order where it came in parts, keeping
// permissions (-p, also for a non-root agent) and modification times to
// the nanosecond (GNU tar reads them from the pax headers), owned by the
// agent's user; then removes it. The archive was checked and rewritten
// by the server: names clean and relative, no special files, no hard
// links. A constant: the path is an argument.
const unpackScript = `b=$0; set -- "$b".p[0-9][0-9][0-9][0-9]; [ -e "$1" ] || set -- "$b"
mkdir -p -- ` + workspace + ` && cat -- "$@" | tar -x -z -p -f - -C ` + workspace + ` --no-same-owner --delay-directory-restore --warning=no-timestamp; rc=$?
rm -f -- "$@"; exit $rc`

// packScript writes the workspace as a gzip pax tar to $0 (pax keeps the
// nanoseconds of modification times, GNU tar's own format does not):
// hard links as the files they link to, without git's objects (never
// changes), delegate's files in transit (xferPrefix) nor the simulator's
// agent directory (.qga, pvesim/doc.go); then prints the archive's sha256
// and size, which a transfer over HTTP checks. Exit status 1 is GNU
// tar's "a file changed as it was read", which a background process of a
// kept sandbox may cause: the archive is still whole.
const packScript = `d=` + workspace + `
` + packTar

// packTar is packScript's packing of the directory $d into $0.
const packTar = `umask 077; tar -c -z -f "$0" --format=posix -C "$d" --hard-dereference --exclude=./.git/objects --exclude=./.qga --exclude='./` +
	`.delegate-xfer-*' --warning=no-file-ignored .; rc=$?
[ $rc -le 1 ] || { rm -f -- "$0"; exit $rc; }
s=$(sha256sum <"$0") && n=$(wc -c <"$0") && echo "${s%% *} $n" && exit $rc`

// packDirScript is packScript for the workspace's directory $1 alone
// (sandbox.DirArchiver): one that is not there exits 3; one reached
// through a link, or not a directory, exits 4.
const packDirScript = `w=$(cd -P ` + workspace + ` && pwd -P) || exit 4
[ -e "$w/$1" ] || [ -L "$w/$1" ] || { echo "no such directory" >&2; exit 3; }
d=$(cd -P -- "$w/$1" 2>/dev/null && pwd -P) && [ "$d" = "$w/$1" ] || { echo "a link, or not a directory" >&2; exit 4; }
` + packTar

// writeArchive checks and rewrites the stream (sandbox.ReadArchive:
// what breaks a rule fails here, special files and hard links are left
// out) as a gzip pax tar into w, at gzip's fastest (a stream sent once).
func writeArchive(ctx context.Context, r io.Reader, w io.Writer) (sandbox.Unpacked, error) {
	return packArchive(ctx, r, w, gzip.BestSpeed)
}

// packArchive is writeArchive at a gzip level.
func packArchive(ctx context.Context, r io.Reader, w io.Writer, level int) (sandbox.Unpacked, error) {
	zw, _ := gzip.NewWriterLevel(w, level)
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
	return res, err
}

// PutArchive implements sandbox.Archiver: the stream is checked and
// rewritten (writeArchive) and goes into the guest, over HTTP where the
// VM reaches the server (transfer.go), else in parts through
// agent/file-write; GNU tar unpacks it there in one agent/exec.
func (s *vmSandbox) PutArchive(ctx context.Context, r io.Reader) (sandbox.Unpacked, error) {
	return putArchive(ctx, s, r, true)
}

// putArchive is PutArchive; with check false, r is an archive the server
// has already checked and packed (packArchive: a checkpoint's,
// checkpoint.go), whose bytes go through the agent as they are, not
// checked and compressed again for every fork.
func putArchive(ctx context.Context, s *vmSandbox, r io.Reader, check bool) (sandbox.Unpacked, error) {
	base := xferName(".tgz")
	if x, why := viaHTTP(s); x == nil {
		agentPath(s.b.log, slog.LevelDebug, "workspace in", s.vmid, s.owner.job, why)
	} else if res, used, err := x.put(ctx, s, s.vmid, s.owner.job, r, base, check); used {
		if err == nil {
			err = unpack(ctx, s, base)
		}
		if err != nil {
			return res, fmt.Errorf("put archive in VM %d: %w", s.vmid, err)
		}
		return res, nil
	}
	return putByAgent(ctx, s, r, base, check)
}

// putByAgent is putArchive through the agent: the archive in parts
// (agent/file-write), then unpacked.
func putByAgent(ctx context.Context, s *vmSandbox, r io.Reader, base string, check bool) (sandbox.Unpacked, error) {
	pw := &partWriter{ctx: ctx, s: s, base: base}
	var res sandbox.Unpacked
	var err error
	if check {
		res, err = writeArchive(ctx, r, pw)
	} else {
		_, err = io.Copy(pw, r)
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
	if err := unpack(ctx, s, base); err != nil {
		return res, fmt.Errorf("put archive in VM %d: %w", s.vmid, err)
	}
	return res, nil
}

// unpack unpacks the archive at base (whole, or in parts) into the
// workspace, and removes it.
func unpack(ctx context.Context, s *vmSandbox, base string) error {
	_, err := s.runOK(ctx, []string{"/bin/sh", "-c", unpackScript, base})
	return err
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
// file beside it (xferPrefix), which comes out over HTTP where the VM
// reaches the server (transfer.go), else through agent/file-read (16
// MiB) and then dd through agent/exec, 16 MiB at a time; Close removes
// it.
func (s *vmSandbox) GetArchive(ctx context.Context) (io.ReadCloser, error) {
	return packed(ctx, s, packScript)
}

var _ sandbox.DirArchiver = (*vmSandbox)(nil)

// GetDirArchive implements sandbox.DirArchiver as GetArchive does, for
// the directory alone.
func (s *vmSandbox) GetDirArchive(ctx context.Context, dir string) (io.ReadCloser, error) {
	if !fs.ValidPath(dir) || dir == "." {
		return nil, fmt.Errorf("get archive of %q from VM %d: not a clean relative path", dir, s.vmid)
	}
	return packed(ctx, s, packDirScript, dir)
}

// packed packs with script (packScript, packDirScript; its arguments
// the archive's name, then args) and brings the archive out.
func packed(ctx context.Context, s *vmSandbox, script string, args ...string) (io.ReadCloser, error) {
	name := xferName(".tgz")
	r, err := s.run(ctx, append([]string{"/bin/sh", "-c", script, name}, args...))
	switch {
	case err != nil:
	case r.code == 3 && len(args) > 0:
		err = fmt.Errorf("%s: %w", args[0], fs.ErrNotExist)
	case r.code == 4 && len(args) > 0:
		err = fmt.Errorf("%s: a link, or reached through one, or not a directory", args[0])
	case r.code != 0 && r.code != 1:
		err = fmt.Errorf("tar exited %d: %s", r.code, r.stderr)
	}
	if err != nil {
		s.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", name})
		return nil, fmt.Errorf("get archive from VM %d: %w", s.vmid, err)
	}
	if x, why := viaHTTP(s); x == nil {
		agentPath(s.b.log, slog.LevelDebug, "workspace out", s.vmid, s.owner.job, why)
	} else if sum, n, perr := parseSum(r.stdout); perr != nil {
		agentPath(s.b.log, slog.LevelWarn, "workspace out", s.vmid, s.owner.job, perr.Error())
	} else if rc, used, err := x.get(ctx, s, s.vmid, s.owner.job, "workspace out", name, sum, n); used {
		if err != nil {
			s.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", name})
			return nil, fmt.Errorf("get archive from VM %d: %w", s.vmid, err)
		}
		return rc, nil
	}
	return &guestFile{ctx: ctx, s: s, name: name}, nil
}

// parseSum reads packScript's "SHA256 SIZE" line.
func parseSum(out []byte) (string, int64, error) {
	f := strings.Fields(string(out))
	if len(f) == 2 && len(f[0]) == 64 {
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n >= 0 {
			return f[0], n, nil
		}
	}
	return "", 0, fmt.Errorf("the guest's sha256sum of the workspace said %q", strings.TrimSpace(string(out)))
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
