package proxmox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"

	"github.com/delegate-dev/delegate/sandbox"
)

var _ sandbox.FilesReader = (*vmSandbox)(nil)

// packFilesScript packs the workspace's files named in the list $0.l
// (written in parts, $0.l0000...: NUL-separated names relative to the
// workspace, which may hold any byte but NUL) into the tar $0, each file
// as it is (a name that is gone is left out: --ignore-failed-read; a
// directory is not descended into), and prints its sha256 and size.
// A constant: the names are in the list, never in an argument list.
const packFilesScript = `l=$0.l; umask 077; cat -- "$l"[0-9][0-9][0-9][0-9] >"$l" && rm -f -- "$l"[0-9][0-9][0-9][0-9] || exit 125
tar -c -f "$0" --format=posix -C ` + workspace + ` --null --no-recursion --ignore-failed-read --warning=no-failed-read -T "$l"; rc=$?
rm -f -- "$l"
[ $rc -le 1 ] || { rm -f -- "$0"; exit $rc; }
s=$(sha256sum <"$0") && n=$(wc -c <"$0") && echo "${s%% *} $n"`

// ReadFiles implements sandbox.FilesReader: tar packs the files in the
// guest, in one agent/exec (their names in a list written through the
// agent), into one archive in guestDir, which comes out over HTTP where
// the VM reaches the server (transfer.go: one exec of curl, a sha256
// checked), else through agent/file-read, 16 MiB a call; its regular
// files are handed to fn. Read one by one, each file is an exec of dd
// and its polls.
func (s *vmSandbox) ReadFiles(ctx context.Context, paths []string, fn func(path string, r io.Reader) error) error {
	if len(paths) == 0 {
		return nil
	}
	var list bytes.Buffer
	for _, p := range paths {
		if err := checkWorkspacePath(p); err != nil {
			return err
		}
		list.WriteString("./" + strings.TrimPrefix(p, workspace+"/") + "\x00")
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	name := guestDir + "/files-" + hex.EncodeToString(nonce[:]) + ".tar"
	if err := s.writeParts(ctx, list.Bytes(), func(i int) string { return fmt.Sprintf("%s.l%04d", name, i) }); err != nil {
		return fmt.Errorf("read files from VM %d: write their list: %w", s.vmid, err)
	}
	r, err := s.run(ctx, []string{"/bin/sh", "-c", packFilesScript, name})
	if err == nil && r.code != 0 {
		err = fmt.Errorf("tar exited %d: %s", r.code, r.stderr)
	}
	if err != nil {
		s.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", name, name + ".l"})
		return fmt.Errorf("read files from VM %d: %w", s.vmid, err)
	}
	var rc io.ReadCloser
	if x, why := viaHTTP(s); x == nil {
		agentPath(s.b.log, slog.LevelDebug, "files out", s.vmid, s.owner.job, why)
	} else if sum, n, perr := parseSum(r.stdout); perr != nil {
		agentPath(s.b.log, slog.LevelWarn, "files out", s.vmid, s.owner.job, perr.Error())
	} else if got, used, err := x.get(ctx, s, s.vmid, s.owner.job, "files out", name, sum, n); used {
		if err != nil {
			s.run(context.WithoutCancel(ctx), []string{"/bin/rm", "-f", "--", name})
			return fmt.Errorf("read files from VM %d: %w", s.vmid, err)
		}
		rc = got
	}
	if rc == nil {
		rc = &guestFile{ctx: ctx, s: s, name: name}
	}
	err = readFiles(rc, fn)
	if cerr := rc.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("read files from VM %d: %w", s.vmid, err)
	}
	return nil
}

// readFiles hands the regular files of the tar stream r to fn, then
// reads r to its end: an archive over HTTP is checked there.
func readFiles(r io.Reader, fn func(path string, r io.Reader) error) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(workspace + "/" + hdr.Name)
		if hdr.Typeflag != tar.TypeReg || checkWorkspacePath(name) != nil {
			continue // a name that became a link, a directory, a fifo
		}
		if err := fn(name, tr); err != nil {
			return err
		}
	}
	_, err := io.Copy(io.Discard, r)
	return err
}
