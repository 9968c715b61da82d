package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestExtractModes: every file extracted has the mode and the
// modification time of the archive, to the nanosecond, whatever the
// umask took from it: into an empty directory (where the mode is set only
// when the umask took bits away), one with files already, and one whose
// default ACL would give new files other bits than the umask does.
func TestExtractModes(t *testing.T) {
	modes := []int64{0o400, 0o600, 0o640, 0o644, 0o664, 0o666, 0o700, 0o755, 0o775, 0o777}
	mtime := time.Unix(1_700_000_000, 123_456_789)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777, ModTime: mtime, Format: tar.FormatPAX})
	for _, m := range modes {
		name := "d/" + string(rune('a'+m%26)) + "-" + filepath.Base(os.FileMode(m).String())
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: m, Size: 1, ModTime: mtime, Format: tar.FormatPAX})
		tw.Write([]byte("x"))
	}
	tw.Close()
	archive := buf.Bytes()

	check := func(t *testing.T, dst string) {
		t.Helper()
		if _, err := Extract(context.Background(), bytes.NewReader(archive), dst, ExtractOptions{}); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(bytes.NewReader(archive))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			fi, err := os.Lstat(filepath.Join(dst, h.Name))
			if err != nil {
				t.Fatal(err)
			}
			if got := int64(fi.Mode().Perm()); got != h.Mode {
				t.Errorf("%s: mode %o, want %o", h.Name, got, h.Mode)
			}
			if !fi.ModTime().Equal(mtime) {
				t.Errorf("%s: modified %v, want %v", h.Name, fi.ModTime(), mtime)
			}
		}
	}
	old := syscall.Umask(0o027) // takes bits from most of the modes
	defer syscall.Umask(old)
	t.Run("empty", func(t *testing.T) {
		dst := t.TempDir()
		if runtime.GOOS == "linux" {
			fd, err := syscall.Open(dst, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Close(fd)
			if !emptyWithoutACL(fd) {
				t.Error("an empty new directory is not taken as one")
			}
		}
		check(t, dst)
	})
	t.Run("not empty", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, "there"), nil, 0o644)
		check(t, dst)
	})
	t.Run("default ACL", func(t *testing.T) {
		dst := t.TempDir()
		// A default ACL (version 2; user::rw-, group::r--, other::---) that
		// new files take instead of the umask.
		acl := []byte{2, 0, 0, 0}
		for _, e := range [][2]uint16{{0x01, 6}, {0x04, 4}, {0x20, 0}} {
			acl = binary.LittleEndian.AppendUint16(acl, e[0])
			acl = binary.LittleEndian.AppendUint16(acl, e[1])
			acl = binary.LittleEndian.AppendUint32(acl, 0xffffffff)
		}
		if err := unix.Setxattr(dst, "system.posix_acl_default", acl, 0); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) {
				t.Skipf("no ACLs on this filesystem: %v", err)
			}
			t.Fatal(err)
		}
		if runtime.GOOS == "linux" {
			fd, err := syscall.Open(dst, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Close(fd)
			if emptyWithoutACL(fd) {
				t.Error("a directory with a default ACL is taken as one without")
			}
		}
		check(t, dst)
	})
}
