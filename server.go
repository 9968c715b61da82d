package delegate

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Several servers may share one store (PostgreSQL; or several processes on
// one host sharing a SQLite file). Each server process holds a lease in the
// store, on the store's clock: it registers when it starts and renews the
// lease well before it expires. A server whose lease has expired is dead
// for every other: they adopt its jobs and kept sandboxes (Recover), and
// what it writes afterwards is refused (fenced).
//
// A job's writer is its Owner, at an Epoch the store raises by one at every
// claim and adoption: every write the owner makes names both (a Fence), and
// the store refuses one whose epoch is no longer the job's, in the
// transaction that holds the job's row. Writes that are not the owner's (a
// cancel, a callback from the job's sandbox, an answer) name no fence: the
// state machine alone decides them.

// Server is one server process that shares the store: its lease and what
// other servers need to know of it.
type Server struct {
	// ID is the process's incarnation (Job.Owner of the jobs it drives).
	ID string `json:"id"`
	// Host is its host's name, to be shown; HostID tells hosts apart (the
	// kernel's boot id, or DELEGATE_HOST_ID): a local sandbox is re-attached
	// only by a server with the same HostID. PIDNamespace says whether a
	// server on the same host may judge it by its pid.
	Host         string `json:"host"`
	HostID       string `json:"host_id"`
	PIDNamespace string `json:"-"`
	// Addr is where it serves HTTP ("" none), for delegate servers and
	// errors naming it.
	Addr string `json:"addr,omitempty"`
	// Backend is the sandbox backend it runs jobs on.
	Backend string `json:"backend,omitempty"`
	// StartedAt, RenewedAt and ExpiresAt are the store's times.
	StartedAt time.Time `json:"started_at"`
	RenewedAt time.Time `json:"renewed_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// Live: its lease had not expired when it was read (by the store's
	// clock). Draining: it stopped claiming and hands its work over.
	Live     bool `json:"live"`
	Draining bool `json:"draining,omitempty"`
}

// Term is a lease on a named duty that one server at a time holds (the
// warm pool's keeper): the store hands out a new Term number at every
// election, so that a holder that lost it cannot renew or resign its
// successor's.
type Term struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Term      int64     `json:"term"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Fence names the owner of a job and the epoch it holds the job at: the
// condition of every write that owner makes.
type Fence struct {
	Owner string
	Epoch int64
}

var (
	// ErrFenced: a write named an epoch that is no longer the job's (its
	// writer was thought dead, and another server adopted the job).
	ErrFenced = fmt.Errorf("fenced: %w", ErrConflict)
	// ErrLeaseLost: a server's lease (or a term) expired, or is another's.
	ErrLeaseLost = fmt.Errorf("lease lost: %w", ErrUnavailable)
)

// FencedError is the refusal of a write by an owner that is no longer
// the job's: what it named, and what the job holds.
type FencedError struct {
	Job   string
	Fence Fence
	// Owner and Epoch are the job's now.
	Owner string
	Epoch int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("job %s: write refused: it is held by %s at epoch %d, not by %s at epoch %d (fenced)",
		e.Job, e.Owner, e.Epoch, e.Fence.Owner, e.Fence.Epoch)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// Check is the error a store returns for a write under f on job id that
// the job, held by owner at epoch, refuses; nil when f is the job's.
func (f Fence) Check(id, owner string, epoch int64) error {
	if f.Owner == owner && f.Epoch == epoch {
		return nil
	}
	return &FencedError{Job: id, Fence: f, Owner: owner, Epoch: epoch}
}

type fenceKey struct{}

// WithFence is ctx carrying f: the store writes a job's state, output and
// artifacts made with it only while f is the job's (else ErrFenced).
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceOf is the fence ctx carries, if any.
func FenceOf(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}

// Adopted is a job a server adopted from another (ServerStore.AdoptJobs):
// the job as now stored (owned by the adopter, its epoch raised) and its
// previous owner.
type Adopted struct {
	Job  *Job
	From string
}

// ServerStore keeps the servers that share a store, their leases and
// terms, on the store's clock (never the callers': their hosts' clocks
// may differ). Every implementation passes storetest's Servers.
type ServerStore interface {
	// RegisterServer records a server with a lease of ttl from the store's
	// now, and returns it as stored.
	RegisterServer(ctx context.Context, s Server, ttl time.Duration) (Server, error)
	// RenewServer extends a live lease to ttl from now; a lease that has
	// expired (or is gone) is not renewed: ErrLeaseLost.
	RenewServer(ctx context.Context, id string, ttl time.Duration) (Server, error)
	// ExpireServer ends a lease now (a server stopping, or one known to be
	// dead: its process is gone from this host). Draining marks one that
	// stops claiming.
	ExpireServer(ctx context.Context, id string) error
	DrainServer(ctx context.Context, id string) error
	// Servers lists the servers known, live first, each Live by the
	// store's clock, and that clock's now.
	Servers(ctx context.Context) ([]Server, time.Time, error)
	// AcquireTerm makes holder the holder of duty name for ttl: a new
	// term when the duty is free or its term expired, the same term
	// renewed when holder holds it. Held by another live holder:
	// ErrLeaseLost (a *TermHeldError says by whom).
	AcquireTerm(ctx context.Context, name, holder string, ttl time.Duration) (Term, error)
	// ResignTerm gives term t up (nothing if it is no longer t's).
	ResignTerm(ctx context.Context, t Term) error
	// AdoptJobs makes owner the owner of at most limit unfinished jobs of
	// the owners in from whose leases are not live, each at its epoch
	// plus one, skipping jobs another writer holds locked; owner's own
	// lease must be live (ErrLeaseLost).
	AdoptJobs(ctx context.Context, owner string, from []string, limit int) ([]Adopted, error)
	// RejoinServer gives server s, whose lease expired (it lost it: it
	// was cut from the store, or paused, and is back), a new lease of ttl
	// from now, and takes back the jobs it owned that no other server
	// adopted meanwhile, each at its epoch plus one (what it wrote at the
	// old epochs stays refused); those another adopted stay the
	// adopter's. A lease still live: ErrConflict.
	RejoinServer(ctx context.Context, s Server, ttl time.Duration) (Server, []Adopted, error)
	// Now is the store's clock.
	Now(ctx context.Context) (time.Time, error)
}

// TermHeldError: a duty is another live holder's.
type TermHeldError struct {
	Term Term
}

func (e *TermHeldError) Error() string {
	return fmt.Sprintf("%s is held by %s (term %d) until %s", e.Term.Name, e.Term.Holder, e.Term.Term,
		e.Term.ExpiresAt.Format(time.RFC3339))
}

func (e *TermHeldError) Unwrap() error { return ErrLeaseLost }

// IsFenced reports whether err is a fenced write's refusal.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// JobFeed is a store that tells the processes sharing it, as each change
// commits, which jobs started or ended (PostgreSQL: LISTEN/NOTIFY), so
// that a server wakes its waiters for a job another server drives at once
// rather than at its next poll. A store without one is polled; with one,
// the poll stays behind it (a notification is lost while a listener
// reconnects).
type JobFeed interface {
	// FollowJobs calls changed with each job whose status becomes
	// running or terminal through another process (changes made through
	// this store value are not told: the process knows them), from the
	// moment it calls listening until ctx ends (it returns nil) or the
	// feed fails (its error; a change meanwhile is not told again).
	FollowJobs(ctx context.Context, listening func(), changed func(id string, status Status)) error
}
