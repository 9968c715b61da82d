//go:build linux

package local

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// A checkpoint of a running kept sandbox keeps its processes running
// (issue 38): the sandbox is frozen (the cgroup freezer: nothing runs,
// so nothing writes, and the cut is consistent), its writable layer is
// frozen as a checkpoint's layer and a fresh upper mounted over it on
// the host (layerStore), and then, in every mount namespace of the
// sandbox (init's, and each running command's own), the new workspace
// takes the place of the old at /workspace: then the sandbox is thawed.
// What its processes open from then on, by absolute path, is in the new
// workspace; the commands it starts later copy init's namespace, which
// has it too.
//
// What a process held before the cut stays as it was: a working
// directory in /workspace, or an open file, is of the old workspace,
// which is now the checkpoint's layer. So that nothing changes a
// checkpoint after it is made, the old workspace's mount is made
// read-only in each namespace first (mount_setattr MOUNT_ATTR_RDONLY),
// which the kernel refuses (EBUSY) while a process has a file of it open
// for writing (a write descriptor, or a shared writable mapping): then
// the checkpoint is refused, naming the process and the file, and
// nothing is changed (the sandbox is thawed as it was). A process whose
// working directory was /workspace keeps reading the checkpoint's files
// through relative paths (read-only); getcwd still says /workspace, so
// a program that makes its paths absolute (most do) sees the new one.
//
// The switch in a namespace is made by a thread of the server that
// joins it (a goroutine locked to its thread, which unshares its file
// system attributes so that it alone changes namespace, and which the Go
// runtime ends with the goroutine instead of reusing it: no helper
// process to start). It makes the old workspace read-only and answers;
// then it undoes that (the cut was called off), or leaves it (the cut
// failed after the layer was frozen: the sandbox starts again), or takes
// the new workspace, a detached copy of the host's mount (open_tree
// OPEN_TREE_CLONE), detaches the old one from /workspace (processes that
// hold it keep it) and moves the new one there (move_mount). The
// overlay's superblock is one: a write in any namespace is seen in all,
// and on the host.

// swapStep is what the server tells a namespace's thread after its
// first answer.
type swapStep struct {
	undo bool // make the old workspace writable again
	tree int  // else, if ≥ 0: the new workspace, to attach; < 0: leave it
}

// swap is one namespace's thread, from the server's side.
type swap struct {
	pid    int // a process of the namespace
	answer chan swapAnswer
	step   chan swapStep
}

type swapAnswer struct {
	state string // "ro", "busy", "skip", "ok"; "" with err
	err   error
}

// startSwap starts the thread for the mount namespace of process pid,
// whose /workspace must be the file system dev.
func startSwap(pid int, dev uint64) *swap {
	w := &swap{pid: pid, answer: make(chan swapAnswer, 1), step: make(chan swapStep, 1)}
	go w.offMain(dev)
	return w
}

// offMain runs the swap on a thread that is not the process's first: a
// goroutine that ends locked to that one wedges it, in the namespace it
// joined, and /proc/self (the whole process's mounts, cgroups) is seen
// through it. If this goroutine has the first thread, it keeps it
// locked while another does the work.
func (w *swap) offMain(dev uint64) {
	runtime.LockOSThread()
	if unix.Gettid() != unix.Getpid() {
		w.run(dev) // ends with the thread
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(dev)
	}()
	<-done
	runtime.UnlockOSThread()
}

func (w *swap) run(dev uint64) {
	// Never unlocked: the thread has changed namespace, and goes with
	// the goroutine (never the first thread: offMain).
	runtime.LockOSThread()
	fail := func(what string, err error) {
		w.answer <- swapAnswer{err: fmt.Errorf("process %d's mount namespace: %s: %w", w.pid, what, err)}
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", w.pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		w.answer <- swapAnswer{state: "skip"} // it ended
		return
	}
	defer unix.Close(ns)
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		fail("unshare the file system attributes", err)
		return
	}
	if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
		fail("join it", err)
		return
	}
	var st unix.Stat_t
	if err := unix.Stat("/workspace", &st); err != nil || st.Dev != dev {
		// Not a namespace of the sandbox's root (the network helper's,
		// a copy of the host's).
		w.answer <- swapAnswer{state: "skip"}
		return
	}
	old, err := unix.Open("/workspace", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("open /workspace", err)
		return
	}
	defer unix.Close(old)
	err = unix.MountSetattr(old, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
	switch {
	case errors.Is(err, unix.EBUSY):
		w.answer <- swapAnswer{state: "busy"}
		return
	case err != nil:
		fail("make the old workspace read-only", err)
		return
	}
	w.answer <- swapAnswer{state: "ro"}
	step := <-w.step
	switch {
	case step.undo:
		if err := unix.MountSetattr(old, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
			fail("make the workspace writable again", err)
			return
		}
	case step.tree >= 0:
		// Detached first, so that the old workspace does not stay
		// stacked under the new (a process that holds it keeps it,
		// read-only). If it cannot be, the new one covers it.
		unix.Unmount("/workspace", unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err := unix.MoveMount(step.tree, "", unix.AT_FDCWD, "/workspace", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			fail("attach the new workspace", err)
			return
		}
	}
	w.answer <- swapAnswer{state: "ok"}
}

// wait is the thread's next answer.
func (w *swap) wait() swapAnswer {
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case a := <-w.answer:
		return a
	case <-t.C:
		return swapAnswer{err: fmt.Errorf("process %d's mount namespace: no answer in %s", w.pid, drainTimeout)}
	}
}

// liveCut prepares a checkpoint of a running sandbox, frozen: in every
// mount namespace of its processes the old workspace is made read-only.
// It returns the threads, to be given the new workspace (swapIn), told
// to undo (callOff) or to leave it (keep); none if the sandbox has no
// process (its init is not running: the cut is a cold one). A process
// that holds a file of the workspace open for writing makes it fail with
// sandbox.ErrBusy, every namespace as it was.
func (s *sbox) liveCut(cg cgroupSet, dev uint64) ([]*swap, error) {
	pids, err := cg.procs()
	if err != nil {
		return nil, err
	}
	own, _ := os.Readlink("/proc/self/ns/mnt")
	seen := map[string]bool{own: true}
	var all []*swap
	for _, pid := range pids {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue // gone, or a namespace seen already
		}
		seen[ns] = true
		all = append(all, startSwap(pid, dev))
	}
	var ro []*swap
	var failed []string
	busy := false
	for _, w := range all {
		switch a := w.wait(); {
		case a.err != nil:
			failed = append(failed, a.err.Error())
		case a.state == "ro":
			ro = append(ro, w)
		case a.state == "busy":
			busy = true
		}
	}
	if busy || len(failed) > 0 {
		callOff(ro)
		if len(failed) > 0 {
			return nil, fmt.Errorf("checkpoint sandbox %s: %s", s.id, strings.Join(failed, "; "))
		}
		return nil, fmt.Errorf("checkpoint sandbox %s: %s: a checkpoint must not change after it is made, and that process would go on writing into it; "+
			"end it or let it finish (files under /tmp are not in a checkpoint), then checkpoint again: %w", s.id, writers(pids), sandbox.ErrBusy)
	}
	return ro, nil
}

// callOff makes the old workspace writable again in every namespace.
func callOff(swaps []*swap) { tell(swaps, swapStep{undo: true}) }

// keep leaves the old workspace read-only where it was made so (it is a
// checkpoint's layer now).
func keep(swaps []*swap) { tell(swaps, swapStep{tree: -1}) }

func tell(swaps []*swap, step swapStep) {
	for _, w := range swaps {
		w.step <- step
	}
	for _, w := range swaps {
		w.wait()
	}
}

// swapIn gives every namespace the new workspace, the host's mount at
// ws; the errors of those that failed.
func swapIn(swaps []*swap, ws string) error {
	var errs []error
	for _, w := range swaps {
		tree, err := unix.OpenTree(unix.AT_FDCWD, ws, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			errs = append(errs, fmt.Errorf("a copy of the new workspace: %w", err))
			w.step <- swapStep{tree: -1}
			continue
		}
		defer unix.Close(tree)
		w.step <- swapStep{tree: tree}
	}
	for _, w := range swaps {
		if a := w.wait(); a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return errors.Join(errs...)
}

// writers names (some of) the processes among pids that hold a file of
// /workspace open for writing, and the file.
func writers(pids []int) string {
	var out []string
	for _, pid := range pids {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			// By its path as the process sees it (a file of an
			// overlay has its layer's device number).
			name, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err != nil || !strings.HasPrefix(name, "/workspace/") || !openForWriting(pid, fd.Name()) {
				continue
			}
			out = append(out, fmt.Sprintf("process %d (%s) has %s open for writing", pid, comm(pid), name))
			break
		}
		if len(out) == 3 {
			break
		}
	}
	if len(out) == 0 {
		return "a process holds a file of /workspace open for writing (or mapped, shared and writable)"
	}
	return strings.Join(out, "; ")
}

// openForWriting reads an open file's access mode from fdinfo.
func openForWriting(pid int, fd string) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&unix.O_ACCMODE != unix.O_RDONLY
		}
	}
	return false
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// workspaceDev is the device number of the host's workspace mount (a
// tmpfs, or a layered sandbox's overlay): the same superblock as the
// sandbox's /workspace.
func workspaceDev(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, dirWorkspace), &st); err != nil {
		return 0, fmt.Errorf("the workspace: %w", err)
	}
	return st.Dev, nil
}
