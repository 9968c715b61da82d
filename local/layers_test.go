//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// The state of a workspace as a command sees it: every entry's mode in
// octal, owner, size and checksum, sorted.
const treeScript = `cd /workspace && find . -mindepth 1 \( -type f -printf '%p %m %U:%G %s ' -exec sh -c 'md5sum < "$1" | cut -c1-32' _ {} \; \) -o \( ! -type f -printf '%p %m %U:%G %y %l\n' \) | sort`

func checkpoint(t *testing.T, sb *sbox) sandbox.Checkpoint {
	t.Helper()
	cp, err := sb.Checkpoint(context.Background())
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	return cp
}

func fork(t *testing.T, b *Backend, from string) *sbox {
	t.Helper()
	spec := defaultSpec()
	spec.MultiExec, spec.Expires, spec.From = true, time.Now().Add(time.Minute), from
	return create(t, b, spec)
}

// TestCheckpointRollback: processes go on across a checkpoint (one
// running in the background sees the new workspace by its absolute
// path, and its writes are not in the checkpoint); a rollback after
// rm -rf /workspace/* brings every file back, byte for byte, with its
// mode and owner, and ends what ran; the sandbox runs commands after
// both.
func TestCheckpointRollback(t *testing.T) {
	inEachKeptSandbox(t, time.Minute, func(t *testing.T, mode string, b *Backend, sb *sbox) {
		keptRun(t, sb, `cd /workspace && mkdir -p src/deep && printf 'hello\n' > src/a.txt && chmod 640 src/a.txt &&
			head -c 300000 /dev/urandom > src/deep/blob && chmod 700 src/deep && ln -s a.txt src/link && printf '#!/bin/sh\n' > run.sh && chmod 755 run.sh`)
		before := keptRun(t, sb, treeScript)
		// A background process (left by a command that ended) and a
		// command still running, both started before the checkpoint.
		keptRun(t, sb, `sleep 300 >/dev/null 2>&1 & echo $! > /tmp/bg.pid`)
		keptRun(t, sb, `mkfifo /tmp/go.fifo`)
		running := start(t, sb, "/bin/sh", "-c", `read go < /tmp/go.fifo; cat /workspace/after > /tmp/seen; echo from-running > /workspace/running`)
		cp := checkpoint(t, sb)
		if !strings.HasPrefix(cp.ID, "cp-") || cp.Bytes < 300000 {
			t.Errorf("checkpoint %+v: want an id and at least the files' bytes", cp)
		}
		if got := keptRun(t, sb, treeScript); got != before {
			t.Fatalf("after the checkpoint the files differ:\n%s\nwant\n%s", got, before)
		}
		if got := keptRun(t, sb, `kill -0 $(cat /tmp/bg.pid) && echo alive`); got != "alive\n" {
			t.Errorf("the background process after the checkpoint: %q", got)
		}
		// The command that ran through the checkpoint reads what was
		// written after it and writes into the new workspace.
		keptRun(t, sb, `echo after > /workspace/after && echo go > /tmp/go.fifo`)
		if exit, out := finish(t, running); exit.Code != 0 {
			t.Fatalf("the command running across the checkpoint: %+v %q", exit, out)
		}
		if got := keptRun(t, sb, `cat /tmp/seen /workspace/running`); got != "after\nfrom-running\n" {
			t.Errorf("the command running across the checkpoint saw and wrote %q", got)
		}
		// A process holding a workspace file open for writing makes a
		// checkpoint fail, naming it; nothing changed, it goes on.
		keptRun(t, sb, `sh -c 'exec 3>/workspace/held; echo held >&3; exec sleep 300' >/dev/null 2>&1 & echo $! > /tmp/held.pid`)
		testkit.Eventually(t, 10*time.Second, "the writer holds its file", func() bool {
			return keptRun(t, sb, `cat /workspace/held 2>/dev/null || true`) == "held\n" // not written yet: false, not a failure
		})
		_, err := sb.Checkpoint(context.Background())
		if !errors.Is(err, sandbox.ErrBusy) || !strings.Contains(err.Error(), "/workspace/held open for writing") {
			t.Errorf("a checkpoint while a process writes: %v", err)
		}
		keptRun(t, sb, `echo more > /workspace/more && kill $(cat /tmp/held.pid) && rm /workspace/held /workspace/more /workspace/after /workspace/running`)
		if got := keptRun(t, sb, treeScript); got != before {
			t.Fatalf("after the refused checkpoint the files differ:\n%s\nwant\n%s", got, before)
		}
		keptRun(t, sb, `rm -rf /workspace/* && echo new > /workspace/new`)
		if got := keptRun(t, sb, "ls -A /workspace"); got != "new\n" {
			t.Fatalf("after rm -rf: %q", got)
		}
		if err := sb.Rollback(context.Background(), cp.ID); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		if got := keptRun(t, sb, treeScript); got != before {
			t.Errorf("after the rollback the files differ:\n%s\nwant\n%s", got, before)
		}
		if got := keptRun(t, sb, `grep -l '^sleep$' /proc/[0-9]*/comm 2>/dev/null | wc -l`); strings.TrimSpace(got) != "0" {
			t.Errorf("processes after the rollback: %q, want none (it starts from a clean init)", got)
		}
		// Checkpoints stack: a second one, a change, a rollback to the
		// first again.
		keptRun(t, sb, `echo two > /workspace/two`)
		cp2 := checkpoint(t, sb)
		keptRun(t, sb, `rm /workspace/src/a.txt`)
		if err := sb.Rollback(context.Background(), cp2.ID); err != nil {
			t.Fatal(err)
		}
		if got := keptRun(t, sb, "cat /workspace/two /workspace/src/a.txt"); got != "two\nhello\n" {
			t.Errorf("after the rollback to the second checkpoint: %q", got)
		}
		if err := sb.Rollback(context.Background(), cp.ID); err != nil {
			t.Fatal(err)
		}
		if got := keptRun(t, sb, treeScript); got != before {
			t.Errorf("back at the first checkpoint the files differ:\n%s\nwant\n%s", got, before)
		}
	})
}

// TestFork: forks see the source's files as their own (owner 1000
// inside, their own host ids outside), change and delete them; what one
// writes neither the source nor another fork sees; each fork's disk
// limit holds; the source goes on, and its checkpoints go with it while
// the forks keep what they stand on.
func TestFork(t *testing.T) {
	b := newBackend(t, 0)
	src := keptSandbox(t, b, time.Now().Add(time.Minute))
	keptRun(t, src, `cd /workspace && mkdir d && echo base > d/f && echo keep > k && chmod 600 k`)
	cp := checkpoint(t, src)
	a, c := fork(t, b, cp.ID), fork(t, b, cp.ID)
	for _, f := range []*sbox{a, c} {
		if got := keptRun(t, f, `stat -c '%u:%g %a %n' /workspace/d/f /workspace/k && cat /workspace/d/f`); got != "1000:1000 644 /workspace/d/f\n1000:1000 600 /workspace/k\nbase\n" {
			t.Errorf("fork %s sees %q", f.id, got)
		}
	}
	keptRun(t, a, `echo a >> /workspace/d/f && rm /workspace/k && echo mine > /workspace/a-only`)
	keptRun(t, src, `echo source > /workspace/s-only`)
	if got := keptRun(t, a, `cat /workspace/d/f; ls /workspace`); got != "base\na\na-only\nd\n" {
		t.Errorf("fork a: %q", got)
	}
	for _, f := range []*sbox{src, c} {
		if got := keptRun(t, f, `cat /workspace/d/f /workspace/k; ls /workspace`); !strings.HasPrefix(got, "base\nkeep\n") || strings.Contains(got, "a-only") {
			t.Errorf("%s sees fork a's writes: %q", f.id, got)
		}
	}
	if got := keptRun(t, c, `ls /workspace`); strings.Contains(got, "s-only") {
		t.Errorf("fork c sees the source's write after the fork: %q", got)
	}
	// On the host, what fork a changed is its own job's.
	st, err := a.state()
	if err != nil {
		t.Fatal(err)
	}
	if owner := hostOwner(t, filepath.Join(a.dir, dirUpper, upperDir, "d", "f")); owner != st.hostBase()+jobID {
		t.Errorf("fork a's copy of d/f is host uid %d, want %d (its own job's)", owner, st.hostBase()+jobID)
	}
	// The disk limit is each fork's: 64 MiB written fails, the fork goes on.
	if exit, out := run(t, c, "/bin/sh", "-c", "head -c 80000000 /dev/zero > /workspace/big"); exit.Code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("80 MB into a fork of a 64 MiB disk: %+v %q", exit, out)
	}
	// A rollback to another sandbox's checkpoint is refused, nothing changed.
	if err := a.Rollback(context.Background(), cp.ID); err == nil || !strings.Contains(err.Error(), "its own checkpoints") {
		t.Errorf("rollback of a fork to its source's checkpoint: %v", err)
	}
	if got := keptRun(t, a, `ls /workspace`); got != "a-only\nbig\nd\n" && got != "a-only\nd\n" {
		t.Errorf("after a refused rollback fork a has %q", got)
	}
	// The source goes: its checkpoint with it; the forks keep their files.
	if err := src.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.layers.record(cp.ID); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("the checkpoint of a destroyed sandbox: %v", err)
	}
	if got := keptRun(t, c, `cat /workspace/d/f`); got != "base\n" {
		t.Errorf("fork c after its source went: %q", got)
	}
	if _, err := b.Create(context.Background(), sandbox.Spec{JobID: "x", CPU: 1, MemoryBytes: 64 * mib, DiskBytes: 16 * mib, MultiExec: true, From: cp.ID}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("a fork from a deleted checkpoint: %v", err)
	}
	for _, f := range []*sbox{a, c} {
		if err := f.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(b.layers.dir); len(ents) != 0 {
		t.Errorf("the layers left once every sandbox went: %v", ents)
	}
}

func hostOwner(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// TestForkPaused: a paused sandbox checkpoints (it is quiescent
// already) and stays paused; a fork from it runs.
func TestForkPaused(t *testing.T) {
	b := newBackend(t, 0)
	if b.cg.Freezer == "" {
		t.Skip("this host has no freezer")
	}
	src := keptSandbox(t, b, time.Now().Add(time.Minute))
	keptRun(t, src, `echo paused > /workspace/p`)
	if err := src.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	cp := checkpoint(t, src)
	st, _ := src.state()
	if !st.Cgroup.frozen() {
		t.Error("the source is not paused after its checkpoint")
	}
	f := fork(t, b, cp.ID)
	if got := keptRun(t, f, `cat /workspace/p`); got != "paused\n" {
		t.Errorf("fork of a paused sandbox: %q", got)
	}
	if err := src.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := keptRun(t, src, `cat /workspace/p`); got != "paused\n" {
		t.Errorf("the source after resume: %q", got)
	}
}

// TestForkOfLayers: a fork of a sandbox checkpointed twice (two layers,
// one the first workspace, one an upper) sees both, its own ids on both.
func TestForkOfLayers(t *testing.T) {
	b := newBackend(t, 0)
	src := keptSandbox(t, b, time.Now().Add(time.Minute))
	keptRun(t, src, `echo one > /workspace/one`)
	checkpoint(t, src)
	keptRun(t, src, `echo two > /workspace/two && rm /workspace/one`)
	cp := checkpoint(t, src)
	f := fork(t, b, cp.ID)
	if got := keptRun(t, f, `stat -c '%u %n' /workspace/*; cat /workspace/two; echo three > /workspace/two; cat /workspace/two`); got != "1000 /workspace/two\ntwo\nthree\n" {
		t.Errorf("fork of two layers: %q", got)
	}
}

// TestForksAtOnce: forks made at the same time from one checkpoint of
// two layers (as the engine opens a fork's sandboxes) are each a
// sandbox of their own: their own host ids on both layers (one user
// namespace per source slot, made by a child stopped at its exec, of
// which nothing is left), their writes their own.
func TestForksAtOnce(t *testing.T) {
	b := newBackend(t, 0)
	src := keptSandbox(t, b, time.Now().Add(time.Minute))
	keptRun(t, src, `echo one > /workspace/one`)
	checkpoint(t, src)
	keptRun(t, src, `echo two > /workspace/two`)
	cp := checkpoint(t, src)
	spec := defaultSpec()
	spec.MultiExec, spec.Expires, spec.From = true, time.Now().Add(time.Minute), cp.ID
	forks := make([]sandbox.Instance, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Go(func() { forks[i], errs[i] = b.Create(context.Background(), spec) })
	}
	wg.Wait()
	for i, f := range forks {
		if f != nil {
			t.Cleanup(func() { f.Destroy(context.Background()) })
		}
		if errs[i] != nil {
			t.Fatalf("fork %d: %v", i, errs[i])
		}
	}
	bases := map[uint32]bool{}
	for i, f := range forks {
		sb := f.(*sbox)
		if got := keptRun(t, sb, fmt.Sprintf(`stat -c '%%u %%n' /workspace/*; echo %d >> /workspace/one; cat /workspace/one`, i)); got != fmt.Sprintf("1000 /workspace/one\n1000 /workspace/two\none\n%d\n", i) {
			t.Errorf("fork %d: %q", i, got)
		}
		st, err := sb.state()
		if err != nil {
			t.Fatal(err)
		}
		bases[st.hostBase()] = true
	}
	if len(bases) != len(forks) {
		t.Errorf("%d forks have %d slots of host ids between them", len(forks), len(bases))
	}
	if got := keptRun(t, src, `cat /workspace/one`); got != "one\n" {
		t.Errorf("the source sees the forks' writes: %q", got)
	}
	if left := usernsChildren(t); len(left) > 0 {
		t.Errorf("children made for user namespaces are left: %v", left)
	}
}

// TestIdmapUserns: the user namespace of an idmap, made by a child
// stopped at its exec or (where tracing is refused) by one holding it
// until its stdin closes, shows the files of one slot as the same ids
// of another through an idmapped mount; nothing of either child is left.
func TestIdmapUserns(t *testing.T) {
	b := newBackend(t, 0)
	from, to := b.slots.r.first, b.slots.r.first+slotSize
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", src, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(src, unix.MNT_DETACH) })
	f := filepath.Join(src, "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, int(from+jobID), int(from+jobID)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		make func(from, to uint32) (int, error)
	}{{"stopped at its exec", b.layers.idmapUserns}, {"held", b.layers.idmapUsernsHeld}} {
		ns, err := c.make(from, to)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		at := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
		if err := os.Mkdir(at, 0o755); err != nil {
			t.Fatal(err)
		}
		err = idmapped(src, at, ns)
		unix.Close(ns)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Cleanup(func() { unix.Unmount(at, unix.MNT_DETACH) })
		if got := hostOwner(t, filepath.Join(at, "f")); got != to+jobID {
			t.Errorf("%s: the file of host uid %d is seen as %d, want %d", c.name, from+jobID, got, to+jobID)
		}
	}
	if left := usernsChildren(t); len(left) > 0 {
		t.Errorf("children made for user namespaces are left: %v", left)
	}
}

// usernsChildren lists this process's children that were made for a
// user namespace (usernsHoldCommand) and are there still (stopped at
// their exec, or running).
func usernsChildren(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …
		_, rest, ok := strings.Cut(string(stat), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmd), usernsHoldCommand) {
			left = append(left, e.Name()+" "+fields[0]+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return left
}

// TestCheckpointUnchanged: a checkpoint of a sandbox that wrote nothing
// since its last one is of the same layers (no empty layer frozen, its
// processes untouched, no bytes of its own), as a sandbox forked again
// and again is; a fork and a rollback from it work; one after a write
// freezes a layer as before.
func TestCheckpointUnchanged(t *testing.T) {
	b := newBackend(t, 0)
	src := keptSandbox(t, b, time.Now().Add(time.Minute))
	keptRun(t, src, `echo one > /workspace/one`)
	first := checkpoint(t, src)
	keptRun(t, src, `sleep 300 >/dev/null 2>&1 & echo $! > /tmp/bg.pid`)
	again := checkpoint(t, src)
	r1, err := b.layers.record(first.ID)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.layers.record(again.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := src.state()
	if err != nil {
		t.Fatal(err)
	}
	if len(r2.Layers) != 1 || r2.Layers[0] != r1.Layers[0] || len(st.Lowers) != 1 || again.Bytes != 0 {
		t.Errorf("a checkpoint with nothing written since the last: layers %v (the last's %v), the sandbox's %v, %d bytes; want the same one layer, no bytes",
			r2.Layers, r1.Layers, st.Lowers, again.Bytes)
	}
	if got := keptRun(t, src, `kill -0 $(cat /tmp/bg.pid) && echo alive`); got != "alive\n" {
		t.Errorf("the background process after the checkpoint: %q", got)
	}
	f := fork(t, b, again.ID)
	if got := keptRun(t, f, `cat /workspace/one; echo fork >> /workspace/one`); got != "one\n" {
		t.Errorf("fork of the unchanged checkpoint: %q", got)
	}
	keptRun(t, src, `echo two > /workspace/one`)
	after := checkpoint(t, src)
	if r3, err := b.layers.record(after.ID); err != nil || len(r3.Layers) != 2 {
		t.Errorf("a checkpoint after a write: %+v %v, want a layer more", r3, err)
	}
	if err := src.Rollback(context.Background(), again.ID); err != nil {
		t.Fatal(err)
	}
	if got := keptRun(t, src, `cat /workspace/one`); got != "one\n" {
		t.Errorf("rolled back to the unchanged checkpoint: %q", got)
	}
	for _, id := range []string{first.ID, again.ID, after.ID} {
		if err := b.DeleteCheckpoint(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if got := keptRun(t, f, `cat /workspace/one`); got != "one\nfork\n" {
		t.Errorf("the fork after its checkpoint went: %q", got)
	}
	if got := keptRun(t, src, `cat /workspace/one`); got != "one\n" {
		t.Errorf("the source after its checkpoints went: %q", got)
	}
}
