//go:build linux && amd64

package local

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// bpfRun interprets the subset of classic BPF the filter uses, so the
// filter's decisions can be checked for any syscall, not only the ones a
// probe can safely make.
func bpfRun(t *testing.T, prog []unix.SockFilter, arch, nr uint32, arg0 uint64) uint32 {
	t.Helper()
	action, _ := bpfSteps(t, prog, arch, nr, arg0)
	return action
}

// bpfSteps is bpfRun that also says how many instructions ran.
func bpfSteps(t *testing.T, prog []unix.SockFilter, arch, nr uint32, arg0 uint64) (action uint32, steps int) {
	t.Helper()
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[0:], nr)
	binary.LittleEndian.PutUint32(data[4:], arch)
	binary.LittleEndian.PutUint64(data[16:], arg0)
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		steps++
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += int(map[bool]uint8{true: in.Jt, false: in.Jf}[acc == in.K])
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += int(map[bool]uint8{true: in.Jt, false: in.Jf}[acc >= in.K])
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += int(map[bool]uint8{true: in.Jt, false: in.Jf}[acc&in.K != 0])
		case unix.BPF_RET | unix.BPF_K:
			return in.K, steps
		default:
			t.Fatalf("unexpected BPF instruction %+v at %d", in, pc)
		}
	}
	t.Fatal("the filter fell off its end")
	return 0, steps
}

func TestSeccompProgram(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		kill   = unix.SECCOMP_RET_KILL_PROCESS
		x86    = unix.AUDIT_ARCH_X86_64
	)
	tests := []struct {
		name string
		arch uint32
		nr   uint32
		arg0 uint64
		want uint32
	}{
		{"read", x86, unix.SYS_READ, 0, allow},
		{"execve", x86, unix.SYS_EXECVE, 0, allow},
		{"fork-like clone", x86, unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD), allow},
		{"thread clone", x86, unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD, allow},
		{"clone new user ns", x86, unix.SYS_CLONE, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), eperm},
		{"clone new net ns", x86, unix.SYS_CLONE, unix.CLONE_NEWNET, eperm},
		{"clone new mount ns", x86, unix.SYS_CLONE, unix.CLONE_NEWNS, eperm},
		{"clone3", x86, unix.SYS_CLONE3, 0, enosys},
		{"io_uring_setup", x86, unix.SYS_IO_URING_SETUP, 1, enosys},
		{"io_uring_enter", x86, unix.SYS_IO_URING_ENTER, 0, enosys},
		{"io_uring_register", x86, unix.SYS_IO_URING_REGISTER, 0, enosys},
		{"x32 read", x86, 0x40000000, 0, eperm},
		{"other arch", unix.AUDIT_ARCH_I386, 1, 0, kill},
		{"mount", x86, unix.SYS_MOUNT, 0, eperm},
		{"unshare", x86, unix.SYS_UNSHARE, 0, eperm},
		{"ptrace", x86, unix.SYS_PTRACE, 0, eperm},
		{"mount_setattr", x86, unix.SYS_MOUNT_SETATTR, 0, eperm},
	}
	for _, nr := range deniedSyscalls() {
		tests = append(tests, struct {
			name string
			arch uint32
			nr   uint32
			arg0 uint64
			want uint32
		}{fmt.Sprintf("denied %d", nr), x86, nr, 0, eperm})
	}
	for _, tt := range tests {
		if got := bpfRun(t, prog, tt.arch, tt.nr, tt.arg0); got != tt.want {
			t.Errorf("%s: action %#x, want %#x", tt.name, got, tt.want)
		}
	}
}

// TestSeccompProgramSteps checks every syscall number's decision against
// the lists the filter is made from, and that none takes more than a
// tree's steps: the kernel runs the filter for each number when it loads
// it, so a chain of tests would make every sandbox start slower
// (syscallTree).
func TestSeccompProgramSteps(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint32{
		unix.SYS_CLONE:      unix.SECCOMP_RET_ALLOW,                             // with no namespace flag
		unix.SYS_SOCKET:     unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT), // family 0
		unix.SYS_SOCKETPAIR: unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT),
	}
	for _, nr := range enosysSyscalls() {
		want[nr] = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	}
	for _, nr := range deniedSyscalls() {
		want[nr] = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	}
	// The prefix (architecture, number, x32), a depth of log2 of the
	// numbers the filter names, a leaf of at most 10 tests and a return,
	// and the arguments' tests of clone and socket. (A chain of the
	// numbers takes 54.)
	maxSteps := 4 + bits.Len(uint(len(want))) + 10 + 1 + 2 + len(allowedSocketFamilies())
	deepest := 0
	for nr := uint32(0); nr < 2048; nr++ {
		w, ok := want[nr]
		if !ok {
			w = unix.SECCOMP_RET_ALLOW
		}
		got, steps := bpfSteps(t, prog, unix.AUDIT_ARCH_X86_64, nr, 0)
		if got != w {
			t.Errorf("syscall %d: action %#x, want %#x", nr, got, w)
		}
		deepest = max(deepest, steps)
	}
	if deepest > maxSteps {
		t.Errorf("a syscall number takes %d steps of the filter, want at most %d (a tree, not a chain)", deepest, maxSteps)
	}
	t.Logf("%d instructions, at most %d steps per syscall number", len(prog), deepest)
}

// TestSeccompSocketFamilies checks the filter's decision for socket and
// socketpair with every address family the kernel knows (and a few values
// it does not): only local, IP and netlink sockets may be made.
func TestSeccompSocketFamilies(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow        = unix.SECCOMP_RET_ALLOW
		eafnosupport = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
	)
	allowed := map[uint64]bool{unix.AF_UNIX: true, unix.AF_INET: true, unix.AF_INET6: true, unix.AF_NETLINK: true}
	families := []uint64{0xffffffff, 1 << 16, unix.AF_MAX + 1}
	for af := uint64(0); af <= unix.AF_MAX; af++ {
		families = append(families, af)
	}
	for _, nr := range []uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		for _, af := range families {
			want := eafnosupport
			if allowed[af] {
				want = allow
			}
			if got := bpfRun(t, prog, unix.AUDIT_ARCH_X86_64, nr, af); got != want {
				t.Errorf("syscall %d family %d: action %#x, want %#x", nr, af, got, want)
			}
			// The kernel takes the family as an int: bits above 32 are
			// ignored, by it and by the filter alike.
			if got := bpfRun(t, prog, unix.AUDIT_ARCH_X86_64, nr, af&0xffffffff|0xabcd<<32); got != want {
				t.Errorf("syscall %d family %d with high bits set: action %#x, want %#x", nr, af, got, want)
			}
		}
	}
	// Named, because they are why the rule exists.
	for _, af := range []uint64{unix.AF_VSOCK, unix.AF_PACKET, unix.AF_ALG, unix.AF_KEY, unix.AF_BLUETOOTH, unix.AF_XDP} {
		if got := bpfRun(t, prog, unix.AUDIT_ARCH_X86_64, unix.SYS_SOCKET, af); got != eafnosupport {
			t.Errorf("socket(%d): action %#x, want EAFNOSUPPORT", af, got)
		}
	}
}

// TestSeccompSocketsLive makes the refused sockets (and io_uring) for real
// inside a sandbox. A family this kernel lacks proves nothing (it fails
// the same way outside), so each is compared with the host; the test is
// skipped where the kernel has none of the refused ones.
func TestSeccompSocketsLive(t *testing.T) {
	b := newBackend(t, 0)
	_, out := runHelperIn(t, create(t, b, defaultSpec()), "sockets")
	inside := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			inside[k] = v
		}
	}
	proved := 0
	for _, p := range socketProbes() {
		host := probeResult(p.call())
		got, ok := inside[p.name]
		if !ok {
			t.Errorf("%s: no result from inside the sandbox:\n%s", p.name, out)
			continue
		}
		want := "EAFNOSUPPORT"
		if p.name == "io_uring" {
			want = "ENOSYS"
		}
		switch {
		case p.allowed && host == "ok" && got != "ok":
			t.Errorf("%s: refused inside the sandbox (%s) but a job needs it", p.name, got)
		case !p.allowed && got != want:
			t.Errorf("%s: %s inside the sandbox, want %s (host: %s)", p.name, got, want, host)
		case !p.allowed && host != want:
			proved++ // the kernel has it; the sandbox refused it
			t.Logf("%s: host %s, sandbox %s", p.name, host, got)
		}
	}
	if proved == 0 {
		t.Skip("this kernel has none of the refused socket families nor io_uring: nothing to compare")
	}
}
