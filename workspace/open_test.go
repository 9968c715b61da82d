//go:build linux

package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Opening beneath a directory follows no link, anywhere in the path, and
// never leaves the directory or crosses a mount point: openat2's flags,
// and the portable walk that stands in for them.
func TestOpenBeneath(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"d/f":      "f",
		"lastlink": "->d/f",
		"midlink":  "->d",
		"abslink":  "->" + outside,
	})
	writeFiles(t, outside, map[string]string{"secret": "s"})
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	mounted := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m") == nil
	if mounted {
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		os.WriteFile(filepath.Join(mnt, "x"), []byte("x"), 0o644)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)

	opens := map[string]func(int, string, int, uint32) (int, error){
		"openat2": openBeneath,
		"walk":    func(d int, r string, f int, m uint32) (int, error) { return openWalk(d, r, f, m, false) },
	}
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				path  string
				flags int
				want  error // nil: opens
			}{
				{"d/f", unix.O_RDONLY, nil},
				{"d", unix.O_RDONLY | unix.O_DIRECTORY, nil},
				{"lastlink", unix.O_RDONLY, unix.ELOOP},
				{"midlink/f", unix.O_RDONLY, unix.ELOOP},
				{"midlink", unix.O_RDONLY | unix.O_DIRECTORY, unix.ELOOP},
				{"abslink/secret", unix.O_RDONLY, unix.ELOOP},
				{"../" + filepath.Base(outside) + "/secret", unix.O_RDONLY, unix.EXDEV},
				{"d/../../" + filepath.Base(outside) + "/secret", unix.O_RDONLY, unix.EXDEV},
				{outside + "/secret", unix.O_RDONLY, unix.EXDEV},
			} {
				fd, err := open(root, tc.path, tc.flags, 0)
				if fd >= 0 {
					unix.Close(fd)
				}
				if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
					t.Errorf("%s: %v, want %v", tc.path, err, tc.want)
				}
			}
			if !mounted {
				t.Log("no tmpfs mount here: the mount point case is not checked")
				return
			}
			fd, err := open(root, "mnt/x", unix.O_RDONLY, 0)
			if fd >= 0 {
				unix.Close(fd)
			}
			if !errors.Is(err, unix.EXDEV) {
				t.Errorf("mnt/x: %v, want EXDEV", err)
			}
		})
	}
}
