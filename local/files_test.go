//go:build linux

package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFilesBothWays(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/workspace/in/deep/data.txt", []byte("from the server\n"), 0o640); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	// Overwriting truncates.
	if err := sb.WriteFile(ctx, "/workspace/short", []byte("a much longer first version"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/workspace/short", []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	exit, out := run(t, sb, "/bin/sh", "-c", `
		cat /workspace/in/deep/data.txt
		stat -c '%u:%g %a %n' /workspace/in /workspace/in/deep /workspace/in/deep/data.txt
		echo "[$(cat /workspace/short)]"
		mkdir -p /workspace/out && printf 'from the job' > /workspace/out/result.txt`)
	if exit.Code != 0 {
		t.Fatalf("exit %+v:\n%s", exit, out)
	}
	wantContains(t, out,
		"from the server\n",
		"1000:1000 755 /workspace/in\n",
		"1000:1000 755 /workspace/in/deep\n",
		"1000:1000 640 /workspace/in/deep/data.txt\n",
		"[v2]\n")
	got, err := sb.ReadFile(ctx, "/workspace/out/result.txt", 0, 1<<20)
	if err != nil || string(got) != "from the job" {
		t.Errorf("ReadFile = %q, %v", got, err)
	}
	got, err = sb.ReadFile(ctx, "/workspace/out/result.txt", 0, 4)
	if err != nil || string(got) != "from" {
		t.Errorf("ReadFile with max 4 = %q, %v", got, err)
	}
	if _, err := sb.ReadFile(ctx, "/workspace/missing", 0, 10); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: err = %v, want ErrNotExist", err)
	}
}

func TestFilePathRules(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	ctx := context.Background()
	// The job plants traps: symlinks out of the workspace, a symlinked
	// directory inside it, and a FIFO that would block a naive open.
	exit, out := run(t, sb, "/bin/sh", "-c", `
		cd /workspace && ln -s /etc link && ln -s /etc/passwd flink && ln -s ../.. up &&
		mkdir real && ln -s real inner && mkfifo fifo && echo ok`)
	if exit.Code != 0 {
		t.Fatalf("setup job: %+v\n%s", exit, out)
	}
	bad := []string{
		"relative/path",
		"/etc/passwd",
		"/workspace",
		"/workspace/",
		"/workspacex/a",
		"/workspace/../etc/passwd",
		"/workspace/link/x",
		"/workspace/link/passwd",
		"/workspace/flink",
		"/workspace/up/etc/passwd",
		"/workspace/inner/x", // even a link that stays inside is refused
		"/workspace/fifo",
		"/workspace/a\x00b",
	}
	for _, p := range bad {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := sb.WriteFile(ctx, p, []byte("x"), 0o644); err == nil {
				t.Errorf("WriteFile(%q) succeeded", p)
			}
			if data, err := sb.ReadFile(ctx, p, 0, 100); err == nil {
				t.Errorf("ReadFile(%q) = %q, want an error", p, data)
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("WriteFile/ReadFile(%q) hangs", p)
		}
	}
	// Nothing was written through the links.
	if _, err := os.Stat("/etc/x"); err == nil {
		t.Error("/etc/x exists on the host")
	}
	real := filepath.Join(sb.dir, dirWorkspace, "real")
	if ents, _ := os.ReadDir(real); len(ents) != 0 {
		t.Errorf("a write through /workspace/inner landed in real/: %v", ents)
	}
	err := sb.WriteFile(ctx, "/workspace/link/x", []byte("x"), 0o644)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("WriteFile through a symlink: err = %v, want one that names the symlink", err)
	}
}

func TestWriteFileDiskFull(t *testing.T) {
	b := newBackend(t, 0)
	spec := defaultSpec()
	spec.DiskBytes = 4 * mib
	sb := create(t, b, spec)
	err := sb.WriteFile(context.Background(), "/workspace/big", make([]byte, 8*mib), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("WriteFile of 8 MiB into a 4 MiB workspace: err = %v, want ENOSPC", err)
	}
}

// TestWriteLink: WriteFile with fs.ModeSymlink makes a link, the job's
// own, that resolves inside the sandbox; and nothing is written through
// a link afterwards.
func TestWriteLink(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/workspace/src/real.txt", []byte("real\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, target := range map[string]string{"/workspace/src/alias.txt": "real.txt", "/workspace/etc": "/etc"} {
		if err := sb.WriteFile(ctx, p, []byte(target), fs.ModeSymlink|0o777); err != nil {
			t.Fatalf("link %s: %v", p, err)
		}
	}
	exit, out := run(t, sb, "/bin/sh", "-c", `cat /workspace/src/alias.txt; stat -c '%u:%g %F %N' /workspace/src/alias.txt /workspace/etc`)
	if exit.Code != 0 {
		t.Fatalf("exit %+v:\n%s", exit, out)
	}
	wantContains(t, out, "real\n", "1000:1000 symbolic link '/workspace/src/alias.txt' -> 'real.txt'\n", "1000:1000 symbolic link '/workspace/etc' -> '/etc'\n")
	if err := sb.WriteFile(ctx, "/workspace/etc/x", []byte("no"), 0o644); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a write through a link: %v", err)
	}
}
