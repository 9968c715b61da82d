//go:build unix

package mcpserver

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPollable: pipes and sockets (what MCP clients give a server: Node
// gives socket pairs) are read through the poller; a regular file and a
// device are left as they are, in blocking mode.
func TestPollable(t *testing.T) {
	fileOf := func(t *testing.T, fd int) *os.File {
		t.Helper()
		f := os.NewFile(uintptr(fd), "input")
		t.Cleanup(func() { f.Close() })
		return f
	}
	tests := []struct {
		name     string
		open     func(t *testing.T) *os.File
		pollable bool
	}{
		{"pipe", func(t *testing.T) *os.File {
			var p [2]int
			if err := unix.Pipe(p[:]); err != nil {
				t.Fatal(err)
			}
			fileOf(t, p[1])
			return fileOf(t, p[0])
		}, true},
		{"socket pair", func(t *testing.T) *os.File {
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			fileOf(t, p[1])
			return fileOf(t, p[0])
		}, true},
		{"regular file", func(t *testing.T) *os.File {
			path := filepath.Join(t.TempDir(), "requests")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			fd, err := unix.Open(path, unix.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fileOf(t, fd)
		}, false},
		{"/dev/null", func(t *testing.T) *os.File {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fileOf(t, fd)
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.open(t)
			fd := int(f.Fd())
			polled, restore, err := pollable(f)
			if (err == nil) != tc.pollable {
				t.Fatalf("pollable: %v, want pollable %v", err, tc.pollable)
			}
			flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
			if nb := flags&unix.O_NONBLOCK != 0; nb != tc.pollable {
				t.Errorf("non-blocking %v, want %v", nb, tc.pollable)
			}
			if !tc.pollable {
				return
			}
			if polled.Fd() == f.Fd() {
				t.Error("the pollable file shares its descriptor with the input (closing both would close it twice)")
			}
			polled.Close()
			restore()
			flags, _ = unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
			if flags&unix.O_NONBLOCK != 0 {
				t.Error("restore left the input non-blocking")
			}
		})
	}
}
