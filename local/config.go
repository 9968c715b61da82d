package local

import (
	"log/slog"

	"github.com/delegate-dev/delegate/sandbox"
)

// Config configures a Backend.
type Config struct {
	// Dir holds one directory per sandbox (e.g. $DATA/sandboxes). It is
	// created with mode 0700 if missing.
	Dir string
	// SelfExe is the binary re-executed for the helper processes (shim and
	// init): any program that links this package, whose helpers run
	// before its main (see Reexec). Default: os.Executable().
	SelfExe string
	// RootfsDir holds the root filesystems a job may name in vmTemplate
	// (Spec.Template): each is a directory RootfsDir/NAME, owned by root
	// and writable by none of the sandboxes' users. Empty: none.
	RootfsDir string
	// DefaultTemplate is the operator's default vmTemplate: a name, or the
	// absolute path of a root filesystem, which Spec.Template may then
	// name too (no other path). It is trusted configuration; it must not
	// be "/" nor lead to Dir.
	DefaultTemplate string
	// ToolDirs are host directories of tools (a toolchain, a language
	// runtime) that jobs without a template see read-only at their own
	// paths, with their bin directory (or themselves) on the standard
	// PATH. Each must be a clean absolute path of a directory every user
	// can reach, writable by none of the sandboxes' users; see
	// tools_linux.go.
	ToolDirs []string
	// PidsMax caps the processes and threads of one sandbox, and NoFile
	// the open files of each of its processes (RLIMIT_NOFILE, soft and
	// hard; at most the server's own). 0: chosen from the host's file
	// table (nofile.go), DefaultPidsMax and DefaultNoFile at most.
	PidsMax int
	NoFile  int
	// Sandboxes is how many sandboxes may hold files at once, the share
	// count of the host's file table (nofile.go); DefaultSandboxes when 0.
	Sandboxes int
	// UIDs is the range of host uids and gids the sandboxes' slots are
	// taken from, "FIRST-LAST" (uids.go); DefaultUIDs when empty. New
	// refuses a range that an entry of /etc/subuid, /etc/subgid,
	// /etc/passwd or /etc/group overlaps.
	UIDs string
	// CacheDir keeps the caches jobs ask for (Spec.Caches), per project
	// and name; "": none are kept (Capabilities.Caches is false).
	// CacheMaxBytes bounds them all together: the least recently used go
	// first (DefaultCacheMaxBytes when 0).
	CacheDir      string
	CacheMaxBytes int64
	// Logger receives the backend's own events; nil discards them.
	Logger *slog.Logger
	// Egress, if set, is the server's egress proxy: a sandbox made with
	// Spec.Egress has no network but its listeners (egress_linux.go), and
	// the backend enforces allowlists (Capabilities.EgressProxy).
	Egress sandbox.EgressServer
	// EgressCallbackPort is the port of the callback listener in such a
	// sandbox, which the proxy forwards to the callback server: the
	// server's callback port (0: none).
	EgressCallbackPort int
	// OneShot says the process serves one command line and ends (the
	// CLI's run and exec): nothing is made ahead for a later command of a
	// kept sandbox. What a server makes ahead (the next command's
	// directory and status channel) only its own memory knows of: a
	// process that ends leaves it unused in the sandbox's directory, and
	// the next process makes its own.
	OneShot bool
}

// DefaultOutputLimit is the output kept when Command.OutputLimit is zero or
// negative, so a forgotten limit cannot fill the server's disk.
const DefaultOutputLimit = 16 << 20
