package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of size bytes on a directory of the test's,
// unmounted when the test ends: a small disk to fill.
func mountTmpfs(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file of n bytes in dir, and returns its path.
func fill(t testing.TB, dir string, n int) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMinFree: below the data dir's floor of free space (set, or by
// default the smaller of 1 GiB and 5% of its file system) a submission
// and an open_sandbox are refused, naming the dir, the space free and the
// setting; with room again, they are taken.
func TestMinFree(t *testing.T) {
	for _, tc := range []struct {
		name            string
		size            int64
		minFree         int64
		filler          int
		floor, setFloor string
	}{
		{"set", 16 << 20, 8 << 20, 10 << 20, "8.0 MiB", "DELEGATE_MIN_FREE"},
		{"default: 5% of 64 MiB", 64 << 20, 0, 62 << 20, "3.2 MiB", "DELEGATE_MIN_FREE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := mountTmpfs(t, tc.size)
			f := keptFixture(t, engine.Config{DataDir: data, MinFree: tc.minFree})
			ctx := context.Background()
			filler := fill(t, data, tc.filler)
			_, err := f.eng.Submit(ctx, script("echo hi"), delegate.SubmitOptions{})
			_, oerr := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{})
			for what, err := range map[string]error{"submit": err, "open_sandbox": oerr} {
				var ns *delegate.NoSpaceError
				if !errors.As(err, &ns) || delegate.ErrorKind(err) != delegate.KindUnavailable {
					t.Fatalf("%s below the floor: %v, want a NoSpaceError", what, err)
				}
				for _, want := range []string{data, "free", tc.floor, tc.setFloor} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: %q does not say %q", what, err, want)
					}
				}
			}
			if jobs, _, _ := f.store.ListJobs(ctx, delegate.JobFilter{}); len(jobs) != 0 {
				t.Errorf("a refused submission stored %d jobs", len(jobs))
			}
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			j := f.submit(script("echo hi"))
			f.started().Finish(sandbox.Exit{})
			if got := f.wait(f.eng, j.ID); got.Status != delegate.StatusSuccess {
				t.Errorf("with room again: %s (%s)", got.Status, got.Error)
			}
			if _, err := f.eng.OpenSandbox(ctx, delegate.SandboxSpec{}); err != nil {
				t.Errorf("open_sandbox with room again: %v", err)
			}
		})
	}
}
