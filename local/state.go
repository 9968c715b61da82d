package local

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// Hidden subcommands of SelfExe (see Reexec and helper_linux.h).
const (
	shimCommand = "__sandbox-shim"
	initCommand = "__sandbox-init"
	// execCommand is a kept sandbox's command in the Go helpers: init
	// forks and executes it (a fork of a Go program cannot run Go code),
	// and it executes the job (runExec).
	execCommand = "__sandbox-exec"
	probeArg    = "--probe"
	// setupPrefix starts every line the sandbox machinery itself writes into
	// a job's output, so a user can tell it from the job's own output.
	setupPrefix = "delegate-sandbox: "
)

// helperEnv is the whole environment of the shim and init: nothing of the
// server's (its secrets stay out of the sandbox's pid 1). GORACE only
// matters for binaries built with -race, which otherwise sleep a second at
// exit, twice per job. With c, the C helpers of this binary take the
// shim's part (see helper_linux.h); without, the Go ones do.
func helperEnv(c bool) []string {
	// One P is all a Go helper needs (it copies output and waits), and
	// set, it spares the runtime reading the cgroup limits at start.
	env := []string{"GORACE=atexit_sleep_ms=0", "GOMAXPROCS=1"}
	if c {
		env = append(env, helperSelectEnv+"="+helperSelectC)
	}
	return env
}

// helperSelectEnv=helperSelectC in a shim's environment hands it to the
// C helpers, before the Go runtime starts.
const (
	helperSelectEnv = "DELEGATE_SANDBOX_HELPER"
	helperSelectC   = "c"
)

// Jobs run as uid and gid jobID inside their sandbox, host id
// base+jobID of the sandbox's slot (uids.go).
const jobID = 1000

// Exit codes of a sandbox that could not run its command.
const (
	codeSetupFailed = 125 // the sandbox itself could not be set up
	codeCannotExec  = 126 // the command exists but could not be executed
	codeNotFound    = 127 // the command was not found
)

// Files and directories inside a sandbox directory.
const (
	fileState  = "state.json" // sandboxState, written by Create
	fileExec   = "exec.json"  // execRecord, written by Exec (exclusively)
	fileExit   = "exit.json"  // exitRecord, written by the shim at the end
	fileOutput = "output"     // the kept output, stdout and stderr interleaved
	// fileStreams says which stream each byte of fileOutput is from (see
	// streams.go); a sandbox of a server from before it has none.
	fileStreams = "output.streams"
	fileEvents  = "events" // the job's status lines, kept by the shim
	// fileEventsLatest is the latest status line once the events file is
	// full, and how many came after it was full.
	fileEventsLatest = "events.latest"
	// fileStatusFIFO is the status channel, bound at StatusFile inside,
	// on a tmpfs of its own (dirChannel) so that the job's mount table
	// shows "/status" of that tmpfs as its source, not its path on the
	// host (the data dir's).
	fileStatusFIFO = dirChannel + "/status"
	fileKilled     = "killed"   // marker written by Kill before it kills
	fileDeadline   = "deadline" // marker written by the shim when the deadline kills the job
	fileShimPID    = "shim.pid"
	fileInitPID    = "init.pid" // host pid of the sandbox's pid 1
	fileShimLog    = "shim.log" // the shim's own stderr
	// fileNetHelper is the netHelperRecord of a sandbox with network.
	fileNetHelper = "net.json"
	// fileNetReady is written by pasta once the network is configured.
	fileNetReady = "net.ready"
	dirWorkspace = "workspace"
	dirRootfs    = "rootfs"   // mount point of init's new root tmpfs
	dirTemplate  = "template" // read-only bind of Spec.Template
	dirChannel   = "channel"  // a small tmpfs holding the status channel
	dirVar       = "var"      // the /var of a sandbox with Spec.DiskVar
	// A sandbox that runs many commands (Spec.MultiExec): each command's
	// files (the ones above) are in a directory of its own, execs/<id>,
	// which is its shim's working directory; the sandbox's network
	// namespace is bound at fileNetns; the sandbox's supervisor (its
	// shim.pid and init.pid are the sandbox directory's) takes command
	// requests on fileControl; each command's status channel is the FIFO
	// dirChannel/<id>. (dirTmp: the shared /tmp of kept sandboxes made
	// before they had one init.)
	dirExecs    = "execs"
	dirTmp      = "tmp"
	fileNetns   = "netns"
	fileControl = "control"
	// fileJobPID is the host pid of a kept sandbox's command (its
	// process group's too), written by its shim when the command starts
	// without a cgroup of its own (one with a group is killed through it).
	fileJobPID = "job.pid"
	// dirCaches holds the mount points of the sandbox's caches
	// (cache_linux.go), bound at /cache/NAME inside.
	dirCaches = "caches"
	// dirCacheLayers holds the copy-on-write layers of the sandbox's
	// caches, on a tmpfs of the sandbox's disk size (cache_linux.go).
	dirCacheLayers = "cachelayers"
)

// execUp is how a command's directory (execs/<id>) reaches the sandbox
// directory: the shim's paths are relative to its directory.
const execUp = "../.."

// idPattern is what newID produces; anything else is not one of ours,
// which also keeps ids from being path tricks.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sb-[0-9a-f]{12}$`) })

func newID(prefix string, nbytes int) (string, error) {
	b := make([]byte, nbytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return prefix + hex.EncodeToString(b), nil
}

// sandboxState is what Create records; everything later (the shim, Kill,
// Destroy, a restarted server) works from it.
type sandboxState struct {
	ID          string    `json:"id"`
	JobID       string    `json:"jobId"`
	Created     time.Time `json:"created"`
	CPU         float64   `json:"cpu"`
	MemoryBytes int64     `json:"memoryBytes"`
	DiskBytes   int64     `json:"diskBytes"`
	PidsMax     int       `json:"pidsMax"`
	Template    string    `json:"template,omitempty"`
	Cgroup      cgroupSet `json:"cgroup"`
	// Network is the helper that gives the sandbox network egress; nil:
	// no network but its own loopback.
	Network *netTool `json:"network,omitempty"`
	// Proxy: the sandbox's network is the egress proxy's alone
	// (egress_linux.go); nil: not.
	Proxy *proxyState `json:"proxy,omitempty"`
	// NoFile is its processes' RLIMIT_NOFILE (nofile.go); 0 in the state
	// of a sandbox made before it had one (the backend's then).
	NoFile int `json:"noFile,omitempty"`
	// HostUID is the base of the sandbox's host ids (uids.go), the owner
	// of its user namespace; 0 in the state of a sandbox made before
	// each had its own (legacyIDBase).
	HostUID uint32 `json:"hostUid,omitempty"`
	// Multi: the sandbox runs many commands (Spec.MultiExec), each in
	// execs/<id>; Expires is when its processes end by themselves.
	Multi   bool      `json:"multi,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
	// Init: the kept sandbox has one init, which forks each command (a
	// kept sandbox made before had an init per command and cannot run
	// more).
	Init bool `json:"init,omitempty"`
	// Spawns: its keeper is the C one, which starts its commands' shims
	// when the server asks (spawnMagic), sparing the server a fork and
	// an exec per command; without it the server starts them.
	Spawns bool `json:"spawns,omitempty"`
	// Caches are the caches it has (cache_linux.go).
	Caches []cacheMount `json:"caches,omitempty"`
	// Layered: its workspace is an overlay of an upper (dirUpper) over
	// frozen layers, Lowers, newest first (layers_linux.go); From is the
	// checkpoint it was forked from.
	Layered bool       `json:"layered,omitempty"`
	Lowers  []layerRef `json:"lowers,omitempty"`
	From    string     `json:"from,omitempty"`
	// Var: a writable /var of its own, a tmpfs of the disk's size at
	// dirVar (Spec.DiskVar).
	Var bool `json:"var,omitempty"`
	// TmpBytes: the size of its /tmp when not the default
	// (Spec.TmpBytes).
	TmpBytes int64 `json:"tmp_bytes,omitempty"`
}

// layerRef is one frozen layer as a sandbox or a checkpoint names it.
type layerRef struct {
	ID string `json:"id"`
	// Base is the host id base of the sandbox that wrote it: its files'
	// owners are that slot's.
	Base uint32 `json:"base"`
	// Root is its files' directory in its mount: "." for a sandbox's
	// first workspace, upperDir for an upper.
	Root string `json:"root"`
}

// cacheMount is a cache a sandbox has, as its state records it.
type cacheMount struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Shared: the project's cache is bound; otherwise an empty one of the
	// sandbox's own, because sandbox Busy held it.
	Shared bool `json:"shared,omitempty"`
	// Layer: the project's cache is the lower layer of an overlay whose
	// upper one (what the job changes) is on the sandbox's cache layers'
	// tmpfs, written back when the sandbox goes. Without it (a sandbox
	// made by an earlier server) the cache itself is bound.
	Layer bool `json:"layer,omitempty"`
	// Owner and Limit are sandbox.Cache's: the write-back keeps the
	// owner's caches within Limit.
	Owner string `json:"owner,omitempty"`
	Limit int64  `json:"limit,omitempty"`
	// Busy is the sandbox that held the cache when this one was made
	// (then not Shared).
	Busy string `json:"busy,omitempty"`
	// PerCommand: a kept sandbox's, taken for its commands' runs
	// (cachecmd_linux.go), Shared and Layer then say how.
	PerCommand bool `json:"perCommand,omitempty"`
	// NotSaved: the cache was taken without the last run's changes, and
	// why (cacheMeta.NotSaved), for the command's Exit.CacheMisses.
	NotSaved string `json:"notSaved,omitempty"`
}

// hostBase is the first of the sandbox's host ids: its init's uid and
// gid; its job's are hostBase()+jobID.
func (st sandboxState) hostBase() uint32 {
	if st.HostUID == 0 {
		return legacyIDBase
	}
	return st.HostUID
}

// proxyState is the proxy's part of a sandbox's state.
type proxyState struct {
	// Token names the job's network to the proxy. It never enters the
	// sandbox: the listeners are the job's alone, so the server knows
	// whose they are. (state.json is root's, 0600.)
	Token string `json:"token"`
	// Callback is the port of the callback listener in the sandbox; 0:
	// none.
	Callback int `json:"callback,omitempty"`
	// Trust: the sandbox has a trust bundle (fileTrust at TrustFile).
	Trust bool `json:"trust,omitempty"`
}

// netTool is the network helper of one sandbox, chosen by Create and
// recorded in its state so that the shim, which has no PATH of its own,
// runs that one.
type netTool struct {
	Name string `json:"name"` // "pasta" or "slirp4netns"
	Path string `json:"path"` // absolute
}

// execRecord is the one command of a sandbox, as Exec received it.
type execRecord struct {
	ID   string   `json:"id"`
	Args []string `json:"args"`
	// Env goes to the shim in the plan, never to disk (exec.json).
	Env         []string `json:"env,omitempty"`
	Dir         string   `json:"dir"`
	OutputLimit int64    `json:"outputLimit"`
	// Deadline is when the shim kills the job by itself, server or not.
	Deadline time.Time `json:"deadline,omitzero"`
	// CacheMisses are the sandbox's caches the command had an empty one
	// of instead, and why (cachecmd_linux.go).
	CacheMisses []sandbox.CacheMiss `json:"cacheMisses,omitempty"`
}

// exitRecord is how the command ended, written once by the shim.
type exitRecord struct {
	Code int `json:"code"`
	// Signo is the signal that ended the command, 0 for none. Signal, its
	// name, is only in records of shims before Signo; the server names it.
	Signo       int    `json:"signo,omitempty"`
	Signal      string `json:"signal,omitempty"`
	OOMKilled   bool   `json:"oomKilled"`
	OutputBytes int64  `json:"outputBytes"`
	Truncated   bool   `json:"truncated"`
	Killed      bool   `json:"killed"`
	// DeadlineExceeded: the shim killed the job at its deadline.
	DeadlineExceeded bool `json:"deadlineExceeded,omitempty"`
	// EndedAt is when the command ended (Unix ns, wall clock): a server
	// that adopts the job later gives it that end, not its own time. 0 in
	// records of shims before it.
	EndedAt int64 `json:"endedAt,omitempty"`
	// Reason explains a failure of the sandbox itself (not of the job);
	// the same line is in the output.
	Reason string `json:"reason,omitempty"`
}

// initStatus is what init reports to the shim: how the command ended, or
// why it could not start. On the wire (a pipe, or a kept sandbox's
// command's socket), as the C helpers write it too: int32 code, int32
// signal, uint32 length of the reason, the reason, native-endian.
type initStatus struct {
	Code   int
	Signo  int
	Reason string
}

const initStatusHead = 12

func (s initStatus) encode() []byte {
	b := make([]byte, initStatusHead, initStatusHead+len(s.Reason))
	binary.NativeEndian.PutUint32(b, uint32(int32(s.Code)))
	binary.NativeEndian.PutUint32(b[4:], uint32(int32(s.Signo)))
	binary.NativeEndian.PutUint32(b[8:], uint32(len(s.Reason)))
	return append(b, s.Reason...)
}

// decodeInitStatus reads one report (a reason cut short is kept as far
// as it goes).
func decodeInitStatus(b []byte) (initStatus, bool) {
	if len(b) < initStatusHead {
		return initStatus{}, false
	}
	s := initStatus{Code: int(int32(binary.NativeEndian.Uint32(b))), Signo: int(int32(binary.NativeEndian.Uint32(b[4:])))}
	n := min(uint64(binary.NativeEndian.Uint32(b[8:])), uint64(len(b)-initStatusHead))
	s.Reason = string(b[initStatusHead : initStatusHead+n])
	return s, true
}

// writeFileAtomic replaces path with data so that readers see the old file
// or the new one, never a partial one (a rename within one directory).
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, perm)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, werr)
	}
	return nil
}

func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return writeFileAtomic(path, data, 0o600)
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}
