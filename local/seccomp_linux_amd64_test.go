//go:build linux && amd64

package local

import (
	"encoding/binary"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// bpfRun interprets the subset of classic BPF the filter uses, so the
// filter's decisions can be checked for any syscall, not only the ones a
// probe can safely make.
func bpfRun(t *testing.T, prog []unix.SockFilter, arch, nr uint32, arg0 uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[0:], nr)
	binary.LittleEndian.PutUint32(data[4:], arch)
	binary.LittleEndian.PutUint64(data[16:], arg0)
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
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
			return in.K
		default:
			t.Fatalf("unexpected BPF instruction %+v at %d", in, pc)
		}
	}
	t.Fatal("the filter fell off its end")
	return 0
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
