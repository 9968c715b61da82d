//go:build linux

package local

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// mqAttr is struct mq_attr.
type mqAttr struct {
	Flags, MaxMsg, MsgSize, CurMsgs int64
	_                               [4]int64
}

// mqOpen creates the POSIX message queue name (without its slash, as
// the system call takes it) of 10 messages of 8 KiB.
func mqOpen(name string) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	attr := mqAttr{MaxMsg: 10, MsgSize: 8192}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600, uintptr(unsafe.Pointer(&attr)), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func mqUnlink(name string) {
	if p, err := unix.BytePtrFromString(name); err == nil {
		unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	}
}

// runBudgets is the test binary's "budgets" helper: with "hog", it takes
// every inotify instance and every byte of message queue it can, says
// how many, and holds them until killed; without, it takes one of each.
func runBudgets(args []string) int {
	hog := len(args) == 1 && args[0] == "hog"
	limits, _ := os.ReadFile("/proc/sys/user/max_inotify_instances")
	fmt.Printf("max_inotify_instances %s", limits)
	n := 0
	var ierr error
	for {
		if _, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
			ierr = err
			break
		}
		if n++; !hog {
			break
		}
	}
	fmt.Printf("inotify instances: %d (%v)\n", n, ierr)
	m := 0
	var merr error
	for {
		if _, err := mqOpen(fmt.Sprintf("q%d", m)); err != nil {
			merr = err
			break
		}
		if m++; !hog {
			break
		}
	}
	fmt.Printf("message queues: %d (%v)\n", m, merr)
	if hog {
		fmt.Println("holding")
		waitKilled()
	}
	return 0
}

// TestKernelBudgetsPerSandbox: what a job holds of per-user kernel
// budgets is charged to its sandbox's own host uid, the owner of its user
// namespace, never to root: a job that takes every inotify instance and
// every byte of POSIX message queue it can leaves host root and another
// sandbox able to make theirs. Before, every sandbox's user namespace was
// root's and one job starved root and every other job.
func TestKernelBudgetsPerSandbox(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			ctx := context.Background()
			hog := create(t, b, defaultSpec())
			withHelper(t, hog)
			p, err := hog.Exec(ctx, sandbox.Command{Args: []string{"/workspace/helper", "hog"},
				Env: append([]string{testHelperEnv + "=budgets"}, testEnv...), OutputLimit: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			var out string
			if !waitFor(30*time.Second, func() bool {
				o, _ := p.ReadOutput(ctx, 0, 1<<20)
				out = string(sandbox.Join(o))
				return strings.Contains(out, "holding") || strings.Contains(out, setupPrefix)
			}) || !strings.Contains(out, "holding") {
				t.Fatalf("the hog did not get to hold its budgets: %q", out)
			}
			t.Logf("the hog: %s", out)
			wantContains(t, out, "max_inotify_instances 128\n", "(too many open files)\n")

			// The sandbox's user namespace is its host uid's.
			if owner := nsOwner(t, hog); owner != stateOf(t, hog).HostUID || owner == 0 {
				t.Errorf("the sandbox's user namespace is owned by host uid %d, want its own %d", owner, stateOf(t, hog).HostUID)
			}

			// Host root still can.
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				t.Errorf("host root's inotify_init1 while a job holds all it can: %v", err)
			} else {
				unix.Close(fd)
			}
			q := fmt.Sprintf("delegate-test-%d", os.Getpid())
			mfd, err := mqOpen(q)
			if err != nil {
				t.Errorf("host root's mq_open while a job holds all it can: %v", err)
			} else {
				unix.Close(mfd)
				mqUnlink(q)
			}

			// So does another sandbox.
			other := create(t, b, defaultSpec())
			exit, out2 := runHelperIn(t, other, "budgets")
			if exit.Code != 0 || !strings.Contains(out2, "inotify instances: 1 (<nil>)\n") || !strings.Contains(out2, "message queues: 1 (<nil>)\n") {
				t.Errorf("another sandbox: exit %+v, output %q", exit, out2)
			}
			if a, b := stateOf(t, other).HostUID, stateOf(t, hog).HostUID; a == b || a == 0 {
				t.Errorf("two sandboxes have host uids %d and %d", a, b)
			}
			if err := p.Kill(ctx); err != nil {
				t.Fatal(err)
			}
			finish(t, p)
		})
	}
}

// nsOwner is the host uid that owns the user namespace of sb's init.
func nsOwner(t *testing.T, sb *sbox) uint32 {
	t.Helper()
	var pid int
	if !waitFor(10*time.Second, func() bool {
		var err error
		pid, err = readPID(sb.path(fileInitPID))
		return err == nil
	}) {
		t.Fatal("no init pid")
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var uid uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	return uid
}
