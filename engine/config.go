package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// Config tunes an Engine. A field left zero gets DefaultConfig's (see
// withDefaults for the one rule); each default is documented there.
type Config struct {
	// Defaults fill what a manifest leaves out; zero fields get
	// delegate.ServerDefaults.
	Defaults delegate.Defaults
	// Maxima cap what a manifest may ask for (zero: no cap of the
	// operator's).
	Maxima Maxima
	// MaxConcurrent jobs run at once; more wait as pending.
	MaxConcurrent int
	// Quotas bound what one principal without the admin scope holds at
	// once (quota.go); a zero field is no bound.
	Quotas Quotas
	// OutputLimit bytes of a job's output are kept.
	OutputLimit int64
	// CleanupInterval between sweeps for orphaned sandboxes.
	CleanupInterval time.Duration
	// ProvisionTimeout bounds creating a sandbox and injecting files.
	ProvisionTimeout time.Duration
	// PollInterval is how often a running job's output is collected and its
	// stored status re-read (another process may have cancelled it). Default 200 ms.
	PollInterval time.Duration
	// ChangePoll is how often the store is read for the jobs other
	// processes ended, where the store tells them as they happen
	// (delegate.JobFeed: PostgreSQL's LISTEN/NOTIFY): the poll behind its
	// notifications, for one lost. Default 1 s. Where the store tells
	// nothing, it is read every PollInterval.
	ChangePoll time.Duration
	// Secret resolves a secret name to its value on the server.
	Secret func(name string) (string, bool)
	// CallbackURL is the base URL sandboxes use to reach the callback
	// server (CALLBACK_PUBLIC_URL); empty when there is none.
	CallbackURL string
	// HeartbeatThreshold: a running job with no sign of life for this long
	// is failed ("lost heartbeat").
	HeartbeatThreshold time.Duration
	// ArtifactDir holds artifacts by sha256. ArtifactMaxFile and
	// ArtifactMaxTotal cap one file and one job.
	ArtifactDir      string
	ArtifactMaxFile  int64
	ArtifactMaxTotal int64
	// OpenBackend, for an engine made without a backend, opens one when
	// it needs it: to stop the sandbox of a job it cancels that no live
	// engine drives. Nil: such a job is left to the next server.
	OpenBackend func(ctx context.Context) (sandbox.Backend, error)
	// AdmissionRetry: a job waiting for capacity (see sandbox.Admitter)
	// asks again this often, besides whenever this engine frees room.
	// Default 5 s.
	AdmissionRetry time.Duration
	// OwnerAlive says whether the engine that owns a job is still running;
	// default: same host and its process is alive. Tests inject their own.
	OwnerAlive func(owner string) bool
	Logger     *slog.Logger
	// Observer, if set, hears sandbox starts and job ends (metrics).
	Observer Observer

	// Kept sandboxes (keeper.go): at most MaxSandboxes at once
	// (default delegate.DefaultMaxSandboxes); idle SandboxIdle they are
	// paused, paused SandboxPause they go, SandboxLifetime ends them
	// (defaults delegate.DefaultSandbox*); their timers are checked every
	// SandboxTick (default 5 s).
	MaxSandboxes int
	// MaxForks is the most forks one call makes (forks.go; default
	// delegate.DefaultMaxForks, DELEGATE_MAX_FORKS).
	MaxForks        int
	SandboxIdle     time.Duration
	SandboxPause    time.Duration
	SandboxLifetime time.Duration
	SandboxTick     time.Duration

	// Workspaces (workspace.go): a dir source must lie under one of
	// WorkspaceRoots (clean absolute paths; none: dir sources are
	// refused); a source holds at most WorkspaceMaxBytes and
	// WorkspaceMaxFiles (defaults workspace.DefaultMaxBytes and
	// DefaultMaxFiles), never more than half the job's memory nor its
	// disk. Git sources are cloned under CloneDir (default: under the
	// temporary directory), reaching public addresses and GitAllow.
	WorkspaceRoots    []string
	WorkspaceMaxBytes int64
	WorkspaceMaxFiles int
	CloneDir          string
	GitAllow          []netip.Prefix
	// Egress, if set, is the server's egress proxy (NewEgress): a job
	// whose network reaches out, on a backend with
	// sandbox.Capabilities.EgressProxy, goes through it alone, with a
	// network of its own (token, policy, log) in the store.
	Egress *Egress
	// DataDir is where the store and the sandboxes write (DELEGATE_DATA_DIR):
	// below MinFree bytes free there (DELEGATE_MIN_FREE; 0: the smaller
	// of 1 GiB and 5% of its file system; < 0: no floor), submissions
	// and new sandboxes are refused. "" : not watched.
	DataDir string
	MinFree int64
	// PeekEnd, if set, reads how a sandbox's command ended as its
	// supervisor recorded it, without a backend (local.PeekEnd): a reader
	// says that a running job no live server drives has ended.
	PeekEnd func(sandboxID, execID string) (sandbox.Exit, bool)
	// Retention: finished jobs, ended kept sandboxes and what they keep
	// go this long after they ended (DELEGATE_RETENTION; 0:
	// delegate.DefaultRetention; < 0: kept forever), pruned every
	// PruneInterval (default 1 h).
	Retention     time.Duration
	PruneInterval time.Duration
	// SecretBindings are the operator's NAME_INJECT bindings, by secret:
	// such a secret never enters a job's environment (a placeholder
	// does); the proxy adds it to the job's requests for its host.
	SecretBindings map[string]egress.Binding
	// Leases, if set, makes the engine one of several servers sharing its
	// store (lease.go): a lease, fenced writes, adoption by lease. Nil: it
	// judges other engines by their process, as one host's servers on a
	// SQLite file do.
	Leases *Leases
}

// DefaultConfig is what an Engine runs with where its Config leaves a
// field zero: the one table of the engine's defaults, every field of
// Config in it (TestDefaultConfig holds it to that).
func DefaultConfig() Config {
	return Config{
		Defaults:           delegate.ServerDefaults(),          // per field: what a manifest leaves out
		Maxima:             Maxima{},                           // no cap of the operator's
		MaxConcurrent:      delegate.DefaultMaxConcurrent,      // jobs run at once
		Quotas:             Quotas{},                           // a principal's: none unless set (cmd/ sets the CLI's defaults)
		OutputLimit:        delegate.DefaultOutputLimit,        // bytes of a job's output kept
		CleanupInterval:    delegate.DefaultCleanupInterval,    // between recoveries and sweeps
		ProvisionTimeout:   delegate.DefaultProvisionTimeout,   // to make a sandbox and start the command
		PollInterval:       200 * time.Millisecond,             // a running job's output collected, its status read
		ChangePoll:         time.Second,                        // behind a store's notifications, other processes' ends read
		Secret:             EnvSecret,                          // DELEGATE_SECRET_NAME of the server's environment
		CallbackURL:        "",                                 // no callback server: jobs report on their status channel
		HeartbeatThreshold: delegate.DefaultHeartbeatThreshold, // silence that fails a running job
		ArtifactDir:        defaultArtifactDir(),               // under the temporary directory
		ArtifactMaxFile:    delegate.DefaultArtifactMaxFile,    // bytes of one artifact
		ArtifactMaxTotal:   delegate.DefaultArtifactMaxTotal,   // bytes of one job's artifacts
		OpenBackend:        nil,                                // an engine without a backend leaves orphans to the next server
		AdmissionRetry:     5 * time.Second,                    // a job waiting for capacity asks again
		OwnerAlive:         ownerAlive,                         // same host, and its process alive
		Logger:             discardLogger,                      // nothing logged
		Observer:           nil,                                // no metrics
		MaxSandboxes:       delegate.DefaultMaxSandboxes,       // kept sandboxes at once
		MaxForks:           delegate.DefaultMaxForks,           // forks one call makes
		SandboxIdle:        delegate.DefaultSandboxIdle,        // idle this long, a kept sandbox is paused
		SandboxPause:       delegate.DefaultSandboxPause,       // paused this long, it goes
		SandboxLifetime:    delegate.DefaultSandboxLifetime,    // the longest a kept sandbox lives
		SandboxTick:        5 * time.Second,                    // kept sandboxes' timers checked
		WorkspaceRoots:     nil,                                // no dir source allowed
		WorkspaceMaxBytes:  workspace.DefaultMaxBytes,          // bytes of a workspace source
		WorkspaceMaxFiles:  workspace.DefaultMaxFiles,          // files of a workspace source
		CloneDir:           defaultCloneDir(),                  // under the temporary directory
		GitAllow:           nil,                                // clones reach public addresses only
		Egress:             nil,                                // no egress proxy: allowlists are refused
		DataDir:            "",                                 // free space not watched
		MinFree:            0,                                  // with a DataDir: the smaller of 1 GiB and 5% of its file system
		PeekEnd:            nil,                                // a running job no server drives reads as running
		Retention:          delegate.DefaultRetention,          // what ended goes this long after
		PruneInterval:      time.Hour,                          // between prunes
		SecretBindings:     nil,                                // no secret injected by the proxy
		Leases:             nil,                                // alone on its store: no lease
	}
}

// discardLogger logs nothing.
var discardLogger = slog.New(slog.DiscardHandler)

func defaultArtifactDir() string { return filepath.Join(os.TempDir(), "delegate-artifacts") }
func defaultCloneDir() string    { return filepath.Join(os.TempDir(), "delegate-clones") }

// keepNegative are the fields whose negative value means something
// (Retention: kept forever; MinFree: no floor), which withDefaults
// leaves as they are.
var keepNegative = map[string]bool{"Retention": true, "MinFree": true}

// withDefaults is c with DefaultConfig's value in every field c leaves
// zero, or sets below zero where that means nothing (a count, a size, a
// duration: see keepNegative); Defaults is filled field by field.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.Defaults.Fill(d.Defaults)
	cv, dv := reflect.ValueOf(&c).Elem(), reflect.ValueOf(d)
	for i := range cv.NumField() {
		f, def := cv.Field(i), dv.Field(i)
		negative := f.CanInt() && f.Int() < 0 && !keepNegative[cv.Type().Field(i).Name]
		if !def.IsZero() && (f.IsZero() || negative) {
			f.Set(def)
		}
	}
	return c
}

// workspaceLimits are the caps of a job's source: the operator's, and
// never more than half the job's memory (the workspace is memory on the
// local backend, and on a VM the copy passes through it), nor more than
// its disk.
func (c *Config) workspaceLimits(m *delegate.Manifest) (maxBytes int64, maxFiles int, why string) {
	maxBytes, why = c.WorkspaceMaxBytes, "DELEGATE_WORKSPACE_MAX_BYTES"
	if mem, err := delegate.ParseSize(m.Resources.Memory); err == nil && mem/2 < maxBytes {
		maxBytes, why = mem/2, fmt.Sprintf("half of resources.memory %s", m.Resources.Memory)
	}
	if disk, err := delegate.ParseSize(m.Resources.Disk); err == nil && disk < maxBytes {
		maxBytes, why = disk, fmt.Sprintf("resources.disk %s", m.Resources.Disk)
	}
	return maxBytes, c.WorkspaceMaxFiles, why
}

// gitDial is the address policy of clones: public addresses, and those
// the operator allows besides (DELEGATE_WORKSPACE_GIT_ALLOW), checked on
// the address connected to, after DNS.
func (c *Config) gitDial() workspace.DialFunc {
	if len(c.GitAllow) == 0 {
		return workspace.PublicDial
	}
	allow := c.GitAllow
	d := &net.Dialer{Timeout: 30 * time.Second, Control: func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %s", workspace.ErrAddressRefused, address)
		}
		ip := ap.Addr().Unmap()
		for _, p := range allow {
			if p.Contains(ip) {
				return nil
			}
		}
		return workspace.CheckAddress(ip)
	}}
	return d.DialContext
}
