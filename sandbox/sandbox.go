// Package sandbox defines what the engine needs from an isolation backend:
// create a sandbox (an Instance), put files in it, run commands in it with
// their output kept, read its files back, pause it, destroy it, and find
// it again after a restart. A backend is thin; the life of jobs and of
// kept sandboxes (queue, timeouts, idle timers, statuses) belongs to the
// engine.
//
// sandboxtest.Run is the contract as a test suite: every backend runs it.
package sandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"time"

	"github.com/delegate-dev/delegate"
)

// ErrGone: the sandbox or process no longer exists (destroyed, or lost
// with its host). Recover returns it when there is nothing to re-attach to.
var ErrGone = errors.New("sandbox gone")

// Capabilities tell the engine (and users) what a backend really enforces,
// rather than letting callers guess.
type Capabilities struct {
	FilesystemIsolation bool // the job sees its own root, not the host's
	NetworkIsolation    bool // no network unless asked for
	CPULimit            bool
	MemoryLimit         bool
	PidsLimit           bool
	DiskLimit           bool
	Recover             bool // a running sandbox survives a server restart
	Templates           bool // vmTemplate is honoured
	NetworkEgress       bool // Spec.Network can be honoured
	// NetworkEgressMissing says, when NetworkEgress is false, what the
	// host lacks and how an operator adds it ("neither pasta nor
	// slirp4netns is on this server's PATH: apt-get install passt"); the
	// engine refuses such jobs at submission with it.
	NetworkEgressMissing string
	// Supervised: the backend watches the process itself, so its liveness
	// counts as the job's heartbeat.
	Supervised bool
	// StatusFile is where, inside the sandbox, the job can write status
	// lines that Process.ReadEvents returns, network or not ("" if none).
	StatusFile string
	// InputsDir is where, inside the sandbox, every command finds its
	// inputs ($DELEGATE_INPUTS), when that is one fixed path; "" when
	// each command's are somewhere of their own.
	InputsDir string
	// MultiExec: Exec may be called again on an instance made with
	// Spec.MultiExec, also while earlier commands run; each command sees
	// the files and the network the others left, with the same
	// isolation. Without it an instance runs one command.
	MultiExec bool
	// Pause: an Instance is a Pauser.
	Pause bool
	// Caches: Spec.Caches are honoured (kept between sandboxes).
	Caches bool
	// Workspaces: every Instance is an Archiver.
	Workspaces bool
	// EgressProxy: a sandbox made with Spec.Egress reaches nothing but
	// the server's egress proxy, which alone decides where its job may go
	// (so an allowlist holds); the Backend is an EgressRouter.
	EgressProxy bool
	// EgressTrust: the backend puts Spec.Egress.CACert in the sandbox's
	// trust (EgressRoute.TrustFile), which credentials injected by the
	// proxy need.
	EgressTrust bool
	// Checkpoint: every instance made with Spec.MultiExec is a
	// Checkpointer, Spec.From is honoured, and the Backend is a
	// CheckpointKeeper (checkpoint.go). Without it, CheckpointMissing
	// says why, for the error the engine gives.
	Checkpoint        bool
	CheckpointMissing string
	// CheckpointMemoryMissing says what the host lacks to keep a
	// sandbox's memory in a checkpoint (every backend lacks it today:
	// checkpoints are of files).
	CheckpointMemoryMissing string
}

// Spec describes the sandbox a job needs.
type Spec struct {
	JobID       string
	CPU         float64 // cores, may be fractional
	MemoryBytes int64
	DiskBytes   int64
	Template    string // backend-specific: a root filesystem name (local), a VM template (proxmox)
	Network     bool   // false: no network at all
	// Progress, if set, is told each step of Create as it begins, in words
	// a user reads ("cloning from debian-12 on pve1"). It must not block.
	Progress func(step string)
	// Admission is the room an Admitter reserved for this sandbox, if
	// any: Create uses it instead of placing the sandbox again.
	Admission Admission
	// MultiExec: the instance will run more than one command (a kept
	// sandbox); a backend with Capabilities.MultiExec prepares for it.
	MultiExec bool
	// Expires, if set, is when the instance's processes end even if no
	// server is there to destroy it (a kept sandbox's lifetime).
	Expires time.Time
	// Caches are directories kept between sandboxes, each mounted
	// read-write at /cache/NAME (Capabilities.Caches).
	Caches []Cache
	// Egress, with Network, routes the sandbox's network through the
	// server's egress proxy alone (Capabilities.EgressProxy).
	Egress *Egress
	// From, if set, is a checkpoint (Checkpoint.ID) whose files the
	// sandbox starts with instead of an empty workspace: a fork
	// (Capabilities.Checkpoint; with MultiExec).
	From string
	// DiskVar gives the sandbox a writable, empty /var on its disk (of
	// DiskBytes, as the workspace), as a VM's root file system has one:
	// the Proxmox simulator's guests (package pvesim) make their /var/tmp
	// and /var/lib there. The local backend's own jobs have none.
	DiskVar bool
	// TmpBytes, if positive, is the size of the sandbox's /tmp (a tmpfs,
	// memory): the Proxmox simulator's guests have half their VM's
	// memory there, as a Debian 13 guest has (systemd's tmp.mount,
	// size=50%). 0: the backend's own size.
	TmpBytes int64
}

// Egress is a sandbox's network through the server's egress proxy.
type Egress struct {
	// Token names the job's network to the proxy, which asks the engine
	// for its policy by it.
	Token string
	// CACert, if set, is the job's own certificate authority (PEM), which
	// the sandbox trusts besides its system roots: the proxy stands in
	// with it for the hosts it adds an operator's credential for.
	CACert []byte
}

// EgressServer is the egress proxy as a backend serves it: each listener
// the backend opens for a sandbox is served for that sandbox's token
// until ctx ends. *egress.Proxy is one.
type EgressServer interface {
	Serve(ctx context.Context, ln net.Listener, token string) error
	ServeTransparent(ctx context.Context, ln net.Listener, token string) error
	ServeDNS(ctx context.Context, pc net.PacketConn, token string) error
	ServeDNSStream(ctx context.Context, ln net.Listener, token string) error
	ServeCallback(ctx context.Context, ln net.Listener, token string) error
}

// EgressRoute is how a job inside a sandbox reaches the proxy, for its
// environment.
type EgressRoute struct {
	// ProxyURL is http_proxy's and https_proxy's value (with the token in
	// it where the proxy cannot tell sandboxes apart otherwise).
	ProxyURL string
	// NoProxy is no_proxy's: what the job reaches directly (its own
	// loopback).
	NoProxy string
	// CallbackURL, if set, replaces the server's callback base URL: the
	// job reaches the callback server there.
	CallbackURL string
	// TrustFile is where a sandbox made with Egress.CACert finds its
	// trust bundle (its system roots and the job's CA).
	TrustFile string
}

// EgressRouter is a Backend with Capabilities.EgressProxy.
type EgressRouter interface {
	// EgressRoute says how a job whose network token is token reaches
	// the proxy from one of the backend's sandboxes.
	EgressRoute(token string) EgressRoute
}

// Cache names a kept cache: Name is the directory under /cache, Key the
// project it belongs to (two keys never share one). Jobs that share a
// cache trust each other; one sandbox's command at a time writes it (a
// kept sandbox takes it for each command's run, not for its life), and
// another that asks meanwhile gets an empty one of its own (Progress
// says so, and the command's Exit.CacheMisses).
type Cache struct {
	Name string
	Key  string
	// Owner is the principal whose cache it is (the key is of its
	// name), measured with its others (CacheMeter).
	Owner string
	// Limit is the most the owner's caches may hold together once this
	// one is written back (its disk quota less its checkpoints, when the
	// sandbox was made); 0: no bound but the backend's own. A write-back
	// that would pass it is not made: the log names the quota, and the
	// next run that takes the cache has it in its CacheMisses.
	Limit int64
}

// CacheMeter is a Backend that keeps caches (Capabilities.Caches) and
// measures them per owner, for the owner's disk quota.
type CacheMeter interface {
	// CacheBytes is what owner's caches hold, as measured when each was
	// last released.
	CacheBytes(owner string) (int64, error)
}

// CacheMiss is a cache a command had an empty one of instead, or had
// without the changes of the run before it (its owner's disk quota had
// no room for them), and why.
type CacheMiss struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Step reports a provisioning step through Progress, if there is one.
func (s Spec) Step(step string) {
	if s.Progress != nil {
		s.Progress(step)
	}
}

// DefaultPath is the PATH the engine gives a job whose manifest sets
// none. A backend may add to it the directories of the tools its
// sandboxes hold (a toolchain installed outside it, the operator's tool
// directories); a PATH the job chose it leaves as it is.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ToolchainBins are toolchains' bin directories that installers put
// outside DefaultPath (the Go tarball's /usr/local/go, rustup's and the
// official images' /usr/local/cargo): every backend adds those its
// sandbox's root has to DefaultPath, in this order, so that a job finds
// the same tools on each.
var ToolchainBins = [...]string{"/usr/local/go/bin", "/usr/local/cargo/bin"}

// Command is a process to run in an instance. Args[0] is looked up on the
// sandbox's PATH (from Env) when it has no slash. Nothing here goes
// through a shell: every element is passed to execve as is.
type Command struct {
	Args []string
	Env  []string // KEY=VALUE, the complete environment
	Dir  string   // working directory inside the sandbox, default /workspace
	// Inputs are files the backend puts in the sandbox before the process
	// starts, readable by the job's user only (mode 0400), in a directory
	// of the command's own outside /workspace, whose path the process finds
	// in $DELEGATE_INPUTS (the backend sets it last, over Env). Untrusted
	// text (a task, a script) travels here, never in Args: every user of a
	// host can read a sandbox's argument lists, and the QEMU guest agent
	// logs them. Env, which holds secrets, must never reach an argument
	// list or a log either: a backend that cannot hand an environment over
	// directly writes it as an input of its own.
	Inputs map[string][]byte
	// Stdin names the input the process reads as its standard input; ""
	// gives it /dev/null.
	Stdin string
	// OutputLimit caps the stdout and stderr the backend keeps, both
	// together. Exit.OutputBytes still counts everything the process wrote.
	OutputLimit int64
	// Deadline, if set, is when the backend kills the process even if no
	// server is watching it any more (a backstop: the engine enforces the
	// job's timeout itself, a little earlier).
	Deadline time.Time
}

// Exit is how a process ended.
type Exit struct {
	Code        int    // exit status; 128+signal when killed by a signal
	Signal      string // e.g. "killed", empty when it exited normally
	OOMKilled   bool   // the memory limit was hit and the kernel killed it
	OutputBytes int64  // everything written, kept or not
	Truncated   bool   // OutputBytes > OutputLimit
	Killed      bool   // ended by Process.Kill
	// DeadlineExceeded: the backend killed it at Command.Deadline.
	DeadlineExceeded bool
	// Reason explains a failure of the sandbox itself, not of the command.
	Reason string
	// EndedAt is when the command ended, as the backend's supervisor
	// recorded it (zero: not recorded): a server that adopts the job
	// after it ended gives it this end, not the time it noticed.
	EndedAt time.Time
	// CacheMisses are the caches (Spec.Caches) the command had an empty
	// one of instead of the project's, and why.
	CacheMisses []CacheMiss
}

// Backend creates and re-finds sandboxes.
type Backend interface {
	Name() string
	Capabilities() Capabilities
	// Create provisions a sandbox. It must not leak anything if it fails.
	Create(ctx context.Context, spec Spec) (Instance, error)
	// Recover finds a sandbox created earlier (perhaps by another process of
	// this server that has died), or returns ErrGone.
	Recover(ctx context.Context, id string) (Instance, error)
	// List returns every sandbox this backend holds, so that the cleanup
	// loop can destroy what no job owns.
	List(ctx context.Context) ([]Info, error)
	// Destroy removes a sandbox by id (all its processes, files, limits).
	// Destroying what is already gone is not an error.
	Destroy(ctx context.Context, id string) error
	// Close releases what the backend holds in this process (clients,
	// background work); the sandboxes go on, for Recover to find.
	Close() error
}

// Instance is one live sandbox: a namespace set, a VM. Its commands (one,
// or many with Capabilities.MultiExec) share its files, its network and
// its limits, and trust each other; each has the isolation of the first.
type Instance interface {
	ID() string
	Files
	// Exec starts a command, with an id of its own (Process.ID).
	Exec(ctx context.Context, cmd Command) (Process, error)
	// Process returns the running (or finished) process started by Exec with
	// that id, also after a restart; ErrGone if there is none.
	Process(ctx context.Context, execID string) (Process, error)
	Destroy(ctx context.Context) error
}

// Files reads and writes an instance's workspace. Paths are absolute and
// inside /workspace; one that leaves it (.., a symbolic link that leads
// out) is refused with an error naming the path and the rule, and nothing
// is written.
type Files interface {
	// WriteFile writes a file (creating parent dirs) at an absolute path
	// inside the sandbox, owned by the job's user. With fs.ModeSymlink in
	// mode it makes a symbolic link to data instead.
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	// ReadFile reads a regular file from offset on, at most max bytes.
	ReadFile(ctx context.Context, path string, offset, max int64) ([]byte, error)
	// ListFiles lists what is under a directory of the workspace, without
	// following symbolic links.
	ListFiles(ctx context.Context, opts ListOptions) ([]FileInfo, error)
}

// ListOptions choose what ListFiles lists.
type ListOptions struct {
	Dir   string // absolute, inside /workspace; "" for /workspace
	Depth int    // levels below Dir: 1 its entries, 0 every level
	// Limit: at most this many entries (0: no limit); when there are
	// more, ListFiles returns the first Limit and ErrTruncated.
	Limit int
	// Regular lists regular files only (artifacts).
	Regular bool
}

// Archiver is an Instance whose workspace moves as tar streams: a
// project copied in before the job, read back after it so that the
// engine can tell what the job changed. Every backend that has one
// passes sandboxtest's archive tests.
type Archiver interface {
	// PutArchive unpacks a tar stream (gzip or not) into /workspace, as
	// the job's user: names relative and clean, nothing written through
	// a link, modes' permission bits and modification times (to the
	// nanosecond) kept, special files and hard links skipped. An entry
	// that breaks a rule fails it, naming the entry.
	PutArchive(ctx context.Context, r io.Reader) (Unpacked, error)
	// GetArchive returns /workspace as a tar stream (gzip or not): links
	// as links, hard links as the files they link to, modification times
	// to the nanosecond. It may leave out the objects of git
	// repositories (.git/objects), which are never changes. The caller
	// closes it.
	GetArchive(ctx context.Context) (io.ReadCloser, error)
}

// FilesReader is an Instance that reads many files of its workspace in
// one go, in far fewer steps than a ReadFile each (a Proxmox VM packs
// them and sends them over HTTP). The engine collects a job's artifacts
// through it where an instance has it.
type FilesReader interface {
	// ReadFiles reads the regular files at paths (clean, absolute, in
	// the workspace) and calls fn with each one's path and content, in
	// any order; a path that is no longer a regular file is left out. An
	// error of fn ends it with that error. What fn was given before an
	// error may not have been checked whole.
	ReadFiles(ctx context.Context, paths []string, fn func(path string, r io.Reader) error) error
}

// DirArchiver is an Archiver that packs one directory of the workspace
// alone (delegate cp -r out of a sandbox), not the whole workspace.
type DirArchiver interface {
	// GetDirArchive returns the tree of /workspace/dir (dir relative
	// and clean, not ".") as GetArchive returns the workspace's, with
	// names relative to that directory. A dir that is not there fails
	// with an error that is fs.ErrNotExist; one that is a link, or is
	// reached through one, or is not a directory, fails.
	GetDirArchive(ctx context.Context, dir string) (io.ReadCloser, error)
}

// Unpacked says what PutArchive wrote.
type Unpacked struct {
	Files, Dirs int
	Bytes       int64
	// Skipped lists what was not written and why ("a fifo").
	Skipped []string
}

// HostWorkspace is an Instance whose workspace is a directory the server
// reaches on its own filesystem (the local backend's tmpfs), which the
// engine then reads in place, beneath it, as its owner, without
// following links, rather than through GetArchive.
type HostWorkspace interface {
	WorkspaceDir() string
}

// Pauser is an Instance that can be paused (Capabilities.Pause): its
// processes stop where they are and keep their memory; Resume lets them
// go on. Pausing a paused instance, or resuming a running one, is no
// error.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Process is the job's command, running or finished.
type Process interface {
	ID() string
	// ReadOutput returns kept output from offset on, at most max bytes in
	// all, as pieces in the order they were written (stdout and stderr
	// interleaved), each from one stream; nothing when nothing new was
	// written. Offsets count the bytes of both streams together.
	ReadOutput(ctx context.Context, offset int64, max int) ([]Output, error)
	// ReadEvents returns what the job wrote to its status channel (lines),
	// from offset on, at most max bytes.
	ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error)
	// Wait blocks until the process ends or ctx is done.
	Wait(ctx context.Context) (Exit, error)
	// Kill ends the process and every process it started, at once.
	Kill(ctx context.Context) error
}

// A process's output is kept as the job's: pieces tagged with the stream
// they came from (see the root package). These names keep backends' code
// short.
type (
	Stream = delegate.Stream
	Output = delegate.Output
)

const (
	// Combined: stdout and stderr together, not told apart (output a
	// sandbox made before streams were kept apart).
	Combined = delegate.StreamCombined
	Stdout   = delegate.StreamStdout
	Stderr   = delegate.StreamStderr
)

// Join returns the bytes of outs one after the other: the output as one
// interleaved stream.
func Join(outs []Output) []byte { return delegate.JoinOutput(outs) }

// Append adds data from stream s after outs (see delegate.AppendOutput).
func Append(outs []Output, s Stream, data []byte) []Output {
	return delegate.AppendOutput(outs, s, data)
}

// PollInterval is how often a backend that cannot be notified checks a
// process it re-attached to.
const PollInterval = 100 * time.Millisecond

// FileInfo is a file in the workspace.
type FileInfo struct {
	Path    string      // absolute, inside /workspace
	Size    int64       // bytes; the target's length for a link
	Mode    fs.FileMode // type bits and permissions
	ModTime time.Time
	// Link is a symbolic link's target, as written.
	Link string
}

// ErrTruncated is returned with the entries ListFiles found when
// ListOptions.Limit stopped it.
var ErrTruncated = errors.New("listing truncated at its limit")

// Info names a sandbox and the job it was made for (from Spec.JobID; ""
// when the backend cannot tell).
type Info struct {
	ID    string
	JobID string
}

// LatestEvent may be implemented by a Process whose status channel keeps
// only the latest line once what ReadEvents returns has reached its cap
// (a job flooding the channel must not grow it without end, and its last
// word is what matters).
type LatestEvent interface {
	// LatestEvent returns the last complete line written after the cap
	// was reached, and how many lines were written after it in all (0:
	// the cap was never reached).
	LatestEvent(ctx context.Context) (line string, count int64, err error)
}
