//go:build linux && amd64

package local

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// x32SyscallBit marks x32 ABI syscall numbers on x86_64; a deny-list
// keyed on x86_64 numbers must refuse them all or they would bypass it.
const x32SyscallBit = 0x40000000

// namespaceCloneFlags are the clone(2) flags that create namespaces. A job
// must not make new namespaces: a new user namespace gives back the
// capabilities the sandbox took away, and is the root of many kernel
// exploits.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// deniedSyscalls return EPERM: (re)mounting and namespaces (the escape
// tools), debugging other processes, kernel keyrings, module and kexec
// loading, bpf and perf (large kernel attack surface), userfaultfd (a
// classic exploit helper), file handles (open_by_handle_at escapes bind
// mounts), and host-wide settings (swap, reboot, clocks, accounting, log).
func deniedSyscalls() []uint32 {
	return []uint32{
		unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_UNSHARE, unix.SYS_SETNS,
		unix.SYS_FSOPEN, unix.SYS_FSMOUNT, unix.SYS_FSCONFIG, unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE,
		unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
		unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
		unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
		unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
		unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
		unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
		unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
		unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_ACCT,
		unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_SYSLOG, unix.SYS_IOPL, unix.SYS_IOPERM,
		unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
		unix.SYS_VHANGUP,
	}
}

// allowedSocketFamilies are the only address families a job may open a
// socket of: local sockets, IP, and netlink (which libc and Go use to list
// interfaces and routes). Every other family is kernel code a job has no
// use for, and some reach past the sandbox: AF_VSOCK talks to the
// hypervisor and shares its port space with the host whatever the
// network namespace; AF_PACKET, AF_ALG, AF_KEY, AF_BLUETOOTH and the rest
// are attack surface. socket and socketpair with another family fail with
// EAFNOSUPPORT, as on a kernel built without it, so programs fall back.
func allowedSocketFamilies() []uint32 {
	return []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}
}

// enosysSyscalls fail with ENOSYS, as if this kernel did not have them, so
// that programs use their fallback: clone3 (its flags sit in memory the
// filter cannot read, and libc falls back to clone) and io_uring, whose
// ring submits operations the kernel runs without a syscall the filter
// would see (container runtimes refuse it by default for that reason).
func enosysSyscalls() []uint32 {
	return []uint32{unix.SYS_CLONE3, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER}
}

// Offsets in struct seccomp_data.
const (
	seccompDataNr      = 0
	seccompDataArch    = 4
	seccompDataArg0Low = 16 // args[0], low 32 bits on little-endian
)

// bpfInsn is an instruction whose jumps name labels, resolved by assemble.
type bpfInsn struct {
	code   uint16
	k      uint32
	jt, jf string // label or "" for the next instruction
	label  string // this instruction's label
}

// seccompProgram returns the filter: wrong architecture → kill; x32 →
// EPERM; clone with namespace flags → EPERM; enosysSyscalls → ENOSYS;
// socket and socketpair of a family not in allowedSocketFamilies →
// EAFNOSUPPORT; deniedSyscalls → EPERM; anything else is allowed.
func seccompProgram() ([]unix.SockFilter, error) {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	p := []bpfInsn{
		{code: ld, k: seccompDataArch},
		{code: jeq, k: unix.AUDIT_ARCH_X86_64, jf: "kill"},
		{code: ld, k: seccompDataNr},
		{code: jge, k: x32SyscallBit, jt: "eperm"},
	}
	targets := map[uint32]string{unix.SYS_CLONE: "clone", unix.SYS_SOCKET: "family", unix.SYS_SOCKETPAIR: "family"}
	for _, nr := range enosysSyscalls() {
		targets[nr] = "enosys"
	}
	for _, nr := range deniedSyscalls() {
		targets[nr] = "eperm"
	}
	p = append(p, syscallTree(targets)...)
	p = append(p,
		bpfInsn{label: "clone", code: ld, k: seccompDataArg0Low},
		bpfInsn{code: jset, k: namespaceCloneFlags, jt: "eperm"},
		bpfInsn{code: ret, k: unix.SECCOMP_RET_ALLOW},
		// The family is an int: the kernel reads the low 32 bits only.
		bpfInsn{label: "family", code: ld, k: seccompDataArg0Low},
	)
	for _, af := range allowedSocketFamilies() {
		p = append(p, bpfInsn{code: jeq, k: af, jt: "family-ok"})
	}
	p = append(p,
		bpfInsn{code: ret, k: unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)},
		bpfInsn{label: "family-ok", code: ret, k: unix.SECCOMP_RET_ALLOW},
		bpfInsn{label: "eperm", code: ret, k: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		bpfInsn{label: "enosys", code: ret, k: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		bpfInsn{label: "kill", code: ret, k: unix.SECCOMP_RET_KILL_PROCESS},
	)
	return assemble(p)
}

// syscallTree dispatches on the syscall number in the accumulator: to
// targets[nr]'s label, or else allows the call. It is a balanced tree of
// comparisons, not a chain: the kernel runs a new filter once for every
// syscall number when it is loaded (to find the ones it always allows,
// whose checks it then skips), so a chain of n tests costs n steps per
// number: the chain this replaces made loading the filter take 120 µs
// on this project's machines, on every sandbox's start and every kept
// command's, the tree about 60 µs (TestSeccompProgramSteps bounds its
// depth). Leaves of up to treeLeaf numbers are tested one by one.
func syscallTree(targets map[uint32]string) []bpfInsn {
	const (
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	nrs := slices.Sorted(maps.Keys(targets))
	var out []bpfInsn
	var node func(keys []uint32)
	node = func(keys []uint32) {
		if len(keys) <= treeLeaf {
			for _, nr := range keys {
				out = append(out, bpfInsn{code: jeq, k: nr, jt: targets[nr]})
			}
			out = append(out, bpfInsn{code: ret, k: unix.SECCOMP_RET_ALLOW})
			return
		}
		mid := len(keys) / 2
		high := fmt.Sprintf("nr>=%d", keys[mid])
		out = append(out, bpfInsn{code: jge, k: keys[mid], jt: high})
		node(keys[:mid])
		at := len(out)
		node(keys[mid:])
		out[at].label = high
	}
	node(nrs)
	return out
}

// treeLeaf is how many syscall numbers a leaf of syscallTree tests in a
// row. Loading costs per instruction as well as per step: leaves of 4
// to 10 load fastest (measured), smaller ones make the program longer,
// larger ones the steps.
const treeLeaf = 6

func assemble(p []bpfInsn) ([]unix.SockFilter, error) {
	at := map[string]int{}
	for i, in := range p {
		if in.label != "" {
			at[in.label] = i
		}
	}
	out := make([]unix.SockFilter, len(p))
	for i, in := range p {
		off := func(label string) (uint8, error) {
			if label == "" {
				return 0, nil
			}
			t, ok := at[label]
			d := t - i - 1
			if !ok || d < 0 || d > 255 {
				return 0, fmt.Errorf("seccomp: bad jump from %d to %q", i, label)
			}
			return uint8(d), nil
		}
		jt, err := off(in.jt)
		if err != nil {
			return nil, err
		}
		jf, err := off(in.jf)
		if err != nil {
			return nil, err
		}
		out[i] = unix.SockFilter{Code: in.code, Jt: jt, Jf: jf, K: in.k}
	}
	return out, nil
}

// seccompSupported reports whether installSeccomp can work on this build.
func seccompSupported() error { return nil }

// installSeccomp sets no_new_privs (required to load a filter without
// CAP_SYS_ADMIN, and it keeps setuid binaries from regaining privileges)
// and loads the filter (seccompBytes of seccompProgram, from the plan)
// into every thread of the process (TSYNC), so a job forked from any Go
// thread inherits it.
func installSeccomp(filter []byte) error {
	prog, err := seccompFilter(filter)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("load the filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("thread %d could not be synchronised", r)
	}
	return nil
}
