package engine_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
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
	t.Parallel()
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

// fillUp writes a file in dir until its file system is full, and returns
// its path.
func fillUp(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	for _, n := range []int{4096, 512, 1} { // what a block's tail still holds
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	return p
}

// smallDisk is an engine over the fake backend whose data dir, with the
// SQLite store in it, is a tmpfs of 8 MiB for the test to fill, the
// floor of free space off (MinFree -1), so that what fills it is met
// where it happens. cfg adds the test's own settings.
type smallDisk struct {
	eng     *engine.Engine
	store   *sqlite.DB
	backend *sandboxtest.Fake
	data    string
}

func newSmallDisk(t *testing.T, cfg engine.Config) smallDisk {
	t.Helper()
	ctx := context.Background()
	d := smallDisk{data: mountTmpfs(t, 8<<20), backend: sandboxtest.NewFake()}
	var err error
	if d.store, err = sqlite.Open(ctx, filepath.Join(d.data, "jobs.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.store.Close() })
	cfg.DataDir, cfg.MinFree, cfg.ArtifactDir = d.data, -1, t.TempDir()
	cfg.Defaults = delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}
	d.eng = engine.New(d.store, d.backend, cfg)
	if err := d.eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.eng.Close() })
	return d
}

// TestEndWaitsForRoom: a job that ends while the data dir is full keeps
// its sandbox, and its end (its last output, its status) is stored once
// there is room again: before, the finish failed once ("database or disk
// is full"), the sandbox was destroyed all the same, and the job stayed
// running for ever, its result gone. Its silence while its end waits is
// no lost heartbeat.
func TestEndWaitsForRoom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSmallDisk(t, engine.Config{PollInterval: 10 * time.Millisecond, HeartbeatThreshold: time.Second})
	eng, store, backend, data := d.eng, d.store, d.backend, d.data
	job, err := eng.Submit(ctx, script("build"), delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := <-backend.Started
	p.Write([]byte("before\n"))
	eventually(t, "the first output stored", func() bool { n, _ := store.OutputSize(ctx, job.ID); return n > 0 })

	filler := fillUp(t, data)
	p.Write(bytes.Repeat([]byte("x"), 256<<10))
	p.Write([]byte("\nEND\n"))
	p.Finish(sandbox.Exit{})
	// The end cannot be stored: the job is running still, its sandbox
	// there, and its silence meanwhile (longer than the heartbeat
	// threshold) does not fail it: it has ended.
	time.Sleep(2 * time.Second)
	if j, err := store.GetJob(ctx, job.ID); err != nil || j.Status != delegate.StatusRunning {
		t.Fatalf("on a full disk: %+v, %v; want running", j, err)
	}
	if infos, _ := backend.List(ctx); len(infos) != 1 {
		t.Fatalf("on a full disk the sandbox was destroyed before the job's end was stored (%d left)", len(infos))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	got, err := eng.Wait(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := store.ReadOutput(ctx, job.ID, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := "before\n" + strings.Repeat("x", 256<<10) + "\nEND\n"
	if got.Status != delegate.StatusSuccess || got.ExitCode == nil || *got.ExitCode != 0 || got.OutputLostBytes != 0 || string(joined(out)) != want {
		t.Errorf("with room again: %s (%s), exit %v, lost %d, %d bytes of output stored, want success and %d", got.Status, got.Error,
			got.ExitCode, got.OutputLostBytes, len(joined(out)), len(want))
	}
	eventually(t, "the sandbox destroyed", func() bool { infos, _ := backend.List(ctx); return len(infos) == 0 })
	integrityCheck(t, filepath.Join(data, "jobs.db"))
}

// integrityCheck fails the test if the database at path does not pass
// PRAGMA integrity_check.
func integrityCheck(t testing.TB, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Errorf("integrity_check: %q, %v", ok, err)
	}
}

func joined(outs []delegate.Output) []byte {
	var b []byte
	for _, o := range outs {
		b = append(b, o.Data...)
	}
	return b
}

// TestOpenSandboxNoRoom (issue 35, item 5): an open_sandbox that fails
// for lack of room where the floor did not catch it (the floor off, or
// the disk filled since) says so, naming the data dir ("no space left on
// DIR"), and leaves no sandbox: not the store's "database or disk is
// full", which reaches an agent as "the server's log says why".
func TestOpenSandboxNoRoom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSmallDisk(t, engine.Config{SandboxTick: 10 * time.Millisecond})
	eng, backend, data := d.eng, d.backend, d.data
	filler := fillUp(t, data)
	_, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{})
	var ns *delegate.NoSpaceError
	if !errors.As(err, &ns) || delegate.ErrorKind(err) != delegate.KindUnavailable || !strings.Contains(err.Error(), "no space left on "+data) {
		t.Fatalf("open_sandbox on a full disk: %v, want a NoSpaceError naming %s", err, data)
	}
	if infos, _ := backend.List(ctx); len(infos) != 0 {
		t.Errorf("the refused sandbox left %d instances", len(infos))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.OpenSandbox(ctx, delegate.SandboxSpec{}); err != nil {
		t.Errorf("open_sandbox with room again: %v", err)
	}
	integrityCheck(t, filepath.Join(data, "jobs.db"))
}

// TestEndUnreadableForRoom (issue 35, item 1): a job whose process's end
// could not be read because there was no room to record it fails saying
// "no space left on" the data dir, not the backend's words for a
// supervisor that died ("killed or crashed"); an end unreadable for
// another reason says the process was lost. Neither has an exit code.
func TestEndUnreadableForRoom(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	f := newFixture(t, engine.Config{DataDir: data, MinFree: -1})
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("read the end: the supervisor was killed or crashed: write exit.json: %w", unix.ENOSPC),
			"no space left on " + data + ": the sandbox could not record how the command ended"},
		{errors.New("the supervisor was killed or crashed"), "lost the job's process: the supervisor was killed or crashed"},
	} {
		j := f.submit(script("build"))
		f.started().Fail(tc.err)
		got := f.wait(f.eng, j.ID)
		if got.Status != delegate.StatusFailed || got.ExitCode != nil || !strings.HasPrefix(got.Error, tc.want) {
			t.Errorf("%v: %s (%q), exit %v; want failed (%q...)", tc.err, got.Status, got.Error, got.ExitCode, tc.want)
		}
	}
}

// TestOutputLost (issue 35, item 1): output the command wrote within the
// limit that its sandbox did not keep is stored as lost, with how much
// and why, and the result says the output is incomplete; the job is not
// reported whole (before, a job so was success with its output_bytes and
// none of it stored, nothing said).
func TestOutputLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	j := f.submit(script("build"))
	p := f.started()
	p.Write([]byte("kept\n"))
	p.Lose(100)
	p.Finish(sandbox.Exit{})
	got := f.wait(f.eng, j.ID)
	if got.Status != delegate.StatusSuccess || got.OutputBytes != 105 || got.OutputLostBytes != 100 ||
		!strings.Contains(got.OutputLost, "kept 5 of the 105 bytes") {
		t.Fatalf("%s, output %d bytes, lost %d (%q)", got.Status, got.OutputBytes, got.OutputLostBytes, got.OutputLost)
	}
	res, err := f.eng.Result(context.Background(), j.ID, delegate.ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutputLostBytes != 100 || !strings.Contains(res.Error, "output incomplete: 100 bytes of it were lost") || string(res.Output) != "kept\n" {
		t.Errorf("result: lost %d, error %q, output %q", res.OutputLostBytes, res.Error, res.Output)
	}
}
