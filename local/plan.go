package local

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A plan is everything a sandbox's helpers (the shim and init, see doc.go)
// need to start its one command, or a kept sandbox's init, or one command
// of a kept sandbox (Mode): the server computes it and writes it into the
// shim's descriptor 3. Nothing of it is kept on disk, so the job's
// environment (often secrets) never is.
//
// The root filesystem is a list of steps (ops) that init carries out one
// after the other, so that what a sandbox looks like is decided here, in
// Go, once, whether the helpers that carry it out are the C ones
// (helper_linux.h, builds with cgo) or the Go ones (shim_linux.go,
// init_linux.go).
//
// The encoding is native-endian (the helpers are this same binary on this
// same machine): u32 and u64 numbers, strings as a u32 length and bytes,
// lists as a u32 count and elements. planMagic and planVersion change
// with any change of layout; a helper refuses a plan it does not know.
const (
	planMagic   = 0x44535031 // "DSP1"
	planVersion = 6
	// maxPlanBytes bounds what a helper reads: arguments and environment
	// are limited by execve to a few MiB anyway.
	maxPlanBytes = 64 << 20
)

// opCode is one kind of step. The numbers are shared with
// helper_linux.h (TestCHelperConstants checks them).
type opCode uint32

const (
	// opMount: mount(s0 source, s1 target, s2 fstype, n flags, s3 data).
	opMount opCode = iota + 1
	// opMkdir: mkdir(s0, n mode); an existing directory is no error.
	opMkdir
	// opTouch: create the empty file s0 (mode 0644) if it is missing.
	opTouch
	// opSymlink: symlink(s0 target, s1 path).
	opSymlink
	// opReadOnly: make the mount at s0 and all below it read-only,
	// nosuid and nodev (see readOnlyRecursive).
	opReadOnly
	// opPivot: make s0 the root and detach the old one (see pivot).
	opPivot
	// opUnshareCgroup: a cgroup namespace; failure is ignored (cosmetic).
	opUnshareCgroup
	// opHostname: sethostname(s0).
	opHostname
	// opLoopback: bring up "lo".
	opLoopback
	// opNoCoreDumps: RLIMIT_CORE 0.
	opNoCoreDumps
	// opDropBounding: empty the capability bounding set.
	opDropBounding
	// opSeccomp: no_new_privs and the plan's seccomp filter.
	opSeccomp
	// opResolvConf: bind a file of content s1 over etc/resolv.conf of
	// the root s0 (bindResolvConf). Only the Go helpers have it: the
	// server gives sandboxes with network to them.
	opResolvConf
	// opInput: create the file s0 (it must not exist) with content s1,
	// mode 0400, owned by uid and gid n: one of Command.Inputs.
	opInput
	// opSysctl: write s1 to the existing file s0 (a /proc/sys entry of
	// the sandbox's own namespaces); a file this kernel does not have
	// is skipped.
	opSysctl
	// opNoFile: RLIMIT_NOFILE n, soft and hard.
	opNoFile
	// opUnshare: unshare(n); a failure is fatal (opUnshareCgroup's is not).
	opUnshare
	// opKeepPath: open s0 (O_PATH) and keep it in slot n (of keptSlots)
	// for opBindKept: a path that the next steps cover.
	opKeepPath
	// opBindKept: bind what opKeepPath kept in slot n (or, s1 set, the
	// entry s1 of that directory) onto s0, then close it.
	opBindKept
)

// planMode says what a shim does with its plan (see doc.go).
type planMode uint32

const (
	// modeSandbox: a sandbox's one command, in namespaces made for it.
	modeSandbox planMode = iota
	// modeKeeper: a kept sandbox (Spec.MultiExec): its supervisor, which
	// starts the sandbox's long-lived init and relays command requests
	// to it, until the sandbox goes or Until.
	modeKeeper
	// modeCommand: one command of a kept sandbox, which the sandbox's
	// init forks; the shim collects its output and records its end.
	modeCommand
)

// op is one step of init's set-up. label starts the message of its
// failure ("mount /proc: permission denied").
type op struct {
	code  opCode
	n     uint64
	label string
	s     [4]string
}

// plan is what the server sends the shim. Paths in ops are relative to
// the sandbox directory, the helpers' working directory.
type plan struct {
	OutputLimit int64
	// The status channel (statusBridge): bytes of whole lines kept in the
	// events file, longest line, how often the latest line past that is
	// written, and the pause between reads past it.
	MaxEvents     int64
	MaxStatusLine int64
	LatestEvery   int64 // nanoseconds
	FloodPause    int64 // nanoseconds
	Deadline      int64 // Unix nanoseconds; 0: none
	Cgroup        cgroupSet
	HostIDBase    uint32
	IDRange       uint32
	JobID         uint32
	Args          []string
	Env           []string
	Dir           string
	Seccomp       []byte // struct sock_filter[], as the kernel takes them
	Ops           []op
	Net           netTool // Name "": no network helper
	// Netns: the shim joins the network namespace on its descriptor
	// netnsFD (a C shim; its loopback is up) instead of making one.
	Netns bool
	// Stdin is the file, inside the sandbox once it is built, that the
	// command reads as its standard input (one of its inputs); "" for
	// /dev/null.
	Stdin string
	// Mode: what the shim is (planMode).
	Mode planMode
	// Until (modeKeeper): when the kept sandbox's processes end, server
	// or not (Unix nanoseconds, 0: never).
	Until int64
	// ExecID (modeCommand) names the command: its directory, its child
	// cgroup. Channel is its status channel, a FIFO, as the shim reaches
	// it from its directory.
	ExecID  string
	Channel string
	// Ahead (modeCommand): how many of Ops, from the first, do not
	// depend on the command; SpareOps (modeKeeper) are those steps, which
	// a spare (the next command's process, which init forks before its
	// request) takes while it waits, and skips in its command's plan.
	Ahead    uint32
	SpareOps []op
	// SpareIdle (modeKeeper): how long, in milliseconds, a spare waits
	// for its command before it ends (0: for ever). A kept sandbox
	// without commands then holds no spare: the next command is forked
	// as it comes.
	SpareIdle uint32
}

func (p *plan) marshal() []byte {
	var w planWriter
	w.u32(planMagic)
	w.u32(planVersion)
	w.u64(uint64(p.OutputLimit))
	w.u64(uint64(p.MaxEvents))
	w.u64(uint64(p.MaxStatusLine))
	w.u64(uint64(p.LatestEvery))
	w.u64(uint64(p.FloodPause))
	w.u64(uint64(p.Deadline))
	w.u32(uint32(p.Cgroup.Version))
	w.str(p.Cgroup.Memory)
	w.str(p.Cgroup.CPU)
	w.str(p.Cgroup.Pids)
	w.u32(p.HostIDBase)
	w.u32(p.IDRange)
	w.u32(p.JobID)
	w.strs(p.Args)
	w.strs(p.Env)
	w.str(p.Dir)
	w.str(string(p.Seccomp))
	w.ops(p.Ops)
	w.str(p.Net.Name)
	w.str(p.Net.Path)
	var netns uint32
	if p.Netns {
		netns = 1
	}
	w.u32(netns)
	w.str(p.Stdin)
	w.u32(uint32(p.Mode))
	w.u64(uint64(p.Until))
	w.str(p.Cgroup.Freezer)
	w.str(p.ExecID)
	w.str(p.Channel)
	w.u32(p.Ahead)
	w.ops(p.SpareOps)
	w.u32(p.SpareIdle)
	return w.b
}

func (w *planWriter) ops(ops []op) {
	w.u32(uint32(len(ops)))
	for _, o := range ops {
		w.u32(uint32(o.code))
		w.u64(o.n)
		w.str(o.label)
		for _, s := range o.s {
			w.str(s)
		}
	}
}

func (r *planReader) ops() []op {
	var ops []op
	n := r.count(4 + 8 + 5*4)
	for range n {
		o := op{code: opCode(r.u32()), n: r.u64(), label: r.str()}
		for i := range o.s {
			o.s[i] = r.str()
		}
		ops = append(ops, o)
	}
	return ops
}

func unmarshalPlan(data []byte) (*plan, error) {
	r := planReader{b: data}
	if m, v := r.u32(), r.u32(); r.err == nil && (m != planMagic || v != planVersion) {
		return nil, fmt.Errorf("sandbox plan: version %#x/%d, this helper knows %#x/%d (the server binary was replaced while it ran: restart it)", m, v, planMagic, planVersion)
	}
	p := &plan{}
	p.OutputLimit = int64(r.u64())
	p.MaxEvents = int64(r.u64())
	p.MaxStatusLine = int64(r.u64())
	p.LatestEvery = int64(r.u64())
	p.FloodPause = int64(r.u64())
	p.Deadline = int64(r.u64())
	p.Cgroup.Version = int(r.u32())
	p.Cgroup.Memory = r.str()
	p.Cgroup.CPU = r.str()
	p.Cgroup.Pids = r.str()
	p.HostIDBase = r.u32()
	p.IDRange = r.u32()
	p.JobID = r.u32()
	p.Args = r.strs()
	p.Env = r.strs()
	p.Dir = r.str()
	p.Seccomp = []byte(r.str())
	p.Ops = r.ops()
	p.Net.Name = r.str()
	p.Net.Path = r.str()
	p.Netns = r.u32() != 0
	p.Stdin = r.str()
	p.Mode = planMode(r.u32())
	p.Until = int64(r.u64())
	p.Cgroup.Freezer = r.str()
	p.ExecID = r.str()
	p.Channel = r.str()
	p.Ahead = r.u32()
	p.SpareOps = r.ops()
	p.SpareIdle = r.u32()
	if r.err == nil && int(p.Ahead) > len(p.Ops) {
		r.err = fmt.Errorf("%d steps ahead of %d", p.Ahead, len(p.Ops))
	}
	if r.err == nil && p.Mode > modeCommand {
		r.err = fmt.Errorf("unknown mode %d", p.Mode)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d bytes too many", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("sandbox plan: %w", r.err)
	}
	return p, nil
}

type planWriter struct{ b []byte }

func (w *planWriter) u32(v uint32) { w.b = binary.NativeEndian.AppendUint32(w.b, v) }
func (w *planWriter) u64(v uint64) { w.b = binary.NativeEndian.AppendUint64(w.b, v) }
func (w *planWriter) str(s string) { w.u32(uint32(len(s))); w.b = append(w.b, s...) }
func (w *planWriter) strs(ss []string) {
	w.u32(uint32(len(ss)))
	for _, s := range ss {
		w.str(s)
	}
}

// planReader decodes; after the first error every read returns zero and
// err keeps that error.
type planReader struct {
	b   []byte
	err error
}

var errShortPlan = errors.New("truncated")

func (r *planReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShortPlan
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *planReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.NativeEndian.Uint32(b)
	}
	return 0
}

func (r *planReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.NativeEndian.Uint64(b)
	}
	return 0
}

func (r *planReader) str() string { return string(r.take(uint64(r.u32()))) }

// count reads a list length and checks that that many elements of at
// least min bytes each can follow, so a bad length cannot make the
// reader allocate without bound.
func (r *planReader) count(min int) int {
	n := uint64(r.u32())
	if r.err == nil && n*uint64(min) > uint64(len(r.b)) {
		r.err = errShortPlan
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

func (r *planReader) strs() []string {
	n := r.count(4)
	out := make([]string, 0, n)
	for range n {
		out = append(out, r.str())
	}
	return out
}
