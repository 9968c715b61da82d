package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delegate-dev/delegate"
)

// Leases makes an engine one of several servers that share its store
// (Config.Leases; nil: the engine is alone on its store, as a single
// SQLite server is, and judges other owners by their process).
//
// The engine registers a lease in the store and renews it every TTL/3, on
// the store's clock. Every write it makes as a job's owner names the epoch
// it holds the job at (a delegate.Fence): once another server has adopted
// the job, the store refuses it, and this engine stops driving the job
// (it leaves its sandbox to the adopter). When it cannot renew its lease
// in time (it was paused, or cut from the store) it trusts itself no
// longer: it stops claiming, writes nothing more as an owner and gives up
// its work, which the other servers adopt once the lease has expired.
type Leases struct {
	// TTL of the lease (default 15 s); renewed every TTL/3.
	TTL time.Duration
	// HostID tells hosts apart (default: the kernel's boot id): a local
	// sandbox is re-attached only by a server with the same HostID.
	HostID string
	// Addr is where the server serves HTTP, shown to the others.
	Addr string
	// Clock is this host's clock (nil: time.Now). What a server judges of
	// a lease or a heartbeat is on the store's clock; this one is read
	// only with a renewal, to learn its offset from the store's, so that
	// a host whose clock is far off neither gives its lease up early nor
	// keeps a dead one (a test sets one that is off).
	Clock func() time.Time
}

// DefaultLeaseTTL is a lease's default length.
const DefaultLeaseTTL = 15 * time.Second

// ServerStats is what /metrics says of this server's lease and work.
type ServerStats struct {
	// ID is the server's incarnation; Live says its lease is trusted.
	ID   string
	Live bool
	// LeaseAge is the time since the lease was last renewed.
	LeaseAge time.Duration
	// Adoptions counts jobs adopted from dead servers; FencedWrites the
	// writes refused because another server had adopted the job (or
	// this server's lease was no longer trusted).
	Adoptions    int64
	FencedWrites int64
	// PoolKeeper: this server holds the warm pool's term.
	PoolKeeper bool
}

// leaser is the part that holds this server's lease and the epochs of the
// jobs it drives.
type leaser struct {
	cfg Leases
	// trustFor is how long after a renewal's start this server trusts
	// its lease: less than the TTL, so that it stops acting before the
	// others may adopt its jobs.
	trustFor time.Duration
	store    delegate.ServerStore
	log      *slog.Logger
	me       delegate.Server
	// fallback judges an owner that holds no lease in the store (a CLI
	// process, a server from before leases): by its process.
	fallback func(owner string) bool
	// giveUp stops driving a job without touching its sandbox (its
	// adopter's now).
	giveUp func(id string)

	mu      sync.Mutex
	held    map[string]delegate.Fence // jobs this server drives, at their epoch
	lost    map[string]bool           // jobs fenced: never written again as their owner
	servers map[string]delegate.Server
	seen    time.Time // monotonic: when servers was read
	lastOK  time.Time // monotonic: the start of the last renewal the store took

	dead         atomic.Bool  // the lease was lost: this server drives nothing
	stopped      atomic.Bool  // the lease was ended: the server stops
	late         atomic.Bool  // a renewal found the lease expired after a pause
	draining     atomic.Bool  // delegate servers drain: no new jobs
	offset       atomic.Int64 // the store's clock minus this host's, ns
	adoptions    atomic.Int64
	fencedWrites atomic.Int64
	pool         atomic.Bool // this server holds the warm pool's term
	wantPool     atomic.Bool // a warm pool asked (PoolKeeper)
	poolTerm     atomic.Pointer[delegate.Term]
}

func newLeaser(cfg Leases, store delegate.ServerStore, log *slog.Logger, owner, backend string, fallback func(string) bool) *leaser {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.HostID == "" {
		cfg.HostID = HostID()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	host, _ := os.Hostname()
	return &leaser{cfg: cfg, trustFor: cfg.TTL - cfg.TTL/5, store: store, log: log, fallback: fallback,
		me:   delegate.Server{ID: owner, Host: host, HostID: cfg.HostID, Addr: cfg.Addr, Backend: backend},
		held: make(map[string]delegate.Fence), lost: make(map[string]bool), servers: make(map[string]delegate.Server)}
}

// HostID is this host's id: DELEGATE_HOST_ID, else the kernel's boot id
// (a host restarted is another: its local sandboxes are gone).
func HostID() string {
	if id := os.Getenv("DELEGATE_HOST_ID"); id != "" {
		return id
	}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		return strings.TrimSpace(string(b))
	}
	host, _ := os.Hostname()
	return host
}

// renewEvery is the renewal's period.
func (l *leaser) renewEvery() time.Duration { return l.cfg.TTL / 3 }

// register records this server's lease.
func (l *leaser) register(ctx context.Context) error {
	t0 := time.Now()
	srv, err := l.store.RegisterServer(ctx, l.me, l.cfg.TTL)
	if err != nil {
		return err
	}
	l.renewed(t0, srv)
	l.refresh(ctx)
	l.log.Info("server registered", "server", l.me.ID, "host_id", l.me.HostID, "lease", l.cfg.TTL)
	return nil
}

// renewed records a renewal the store took, started at t0 (monotonic),
// and the store's clock against this host's.
func (l *leaser) renewed(t0 time.Time, srv delegate.Server) {
	// The store stamped the renewal about halfway through its round trip.
	rtt := time.Since(t0)
	l.offset.Store(int64(srv.RenewedAt.Sub(l.cfg.Clock().Add(-rtt / 2))))
	l.mu.Lock()
	l.lastOK = t0
	l.mu.Unlock()
}

// renew extends the lease; one the store no longer has, or one not
// renewed within the trust window, is lost.
func (l *leaser) renew(ctx context.Context) {
	if l.dead.Load() {
		return
	}
	t0 := time.Now()
	wasTrusted := l.trusted()
	rctx, cancel := context.WithTimeout(ctx, l.renewEvery())
	srv, err := l.store.RenewServer(rctx, l.me.ID, l.cfg.TTL)
	cancel()
	switch {
	case err == nil:
		// (Renewed late, after a pause shorter than the lease: no other
		// server could adopt meanwhile.)
		l.renewed(t0, srv)
		l.refresh(ctx)
		l.keepPoolTerm(ctx)
	case errors.Is(err, delegate.ErrLeaseLost) && !wasTrusted && !l.late.Swap(true):
		// Woken after a pause longer than the lease: what its jobs
		// write now is refused by the trust window (counted and logged,
		// the first refusal gives everything up); else the next
		// renewal does.
	case errors.Is(err, delegate.ErrLeaseLost):
		l.lose("its lease expired in the store (the server was paused, or cut from the store, for longer than the lease)")
	case ctx.Err() != nil:
	case !l.trusted():
		l.lose(fmt.Sprintf("the store did not renew its lease within %s: %v", l.trustFor, err))
	default:
		l.log.Warn("renew lease", "err", err)
	}
}

// trusted says whether the lease was renewed recently enough that no
// other server may have adopted this one's jobs.
func (l *leaser) trusted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.dead.Load() && time.Since(l.lastOK) < l.trustFor
}

// lose gives up the lease: this server stops claiming and driving jobs
// (their sandboxes go on, for the servers that adopt them).
func (l *leaser) lose(why string) {
	if l.dead.Swap(true) {
		return
	}
	l.mu.Lock()
	ids := make([]string, 0, len(l.held))
	for id := range l.held {
		ids = append(ids, id)
		l.lost[id] = true
	}
	l.mu.Unlock()
	l.pool.Store(false)
	l.log.Error("lease lost: this server no longer claims or drives jobs, and leaves its work to the others; it registers again once it reaches the store",
		"server", l.me.ID, "why", why, "jobs_given_up", len(ids))
	for _, id := range ids {
		l.giveUp(id)
	}
}

// rejoined records the new lease of a server that had lost its own
// (RejoinServer), taken at t0: it trusts it, and claims, again.
func (l *leaser) rejoined(ctx context.Context, t0 time.Time, srv delegate.Server, back int) {
	l.renewed(t0, srv)
	l.late.Store(false)
	l.dead.Store(false)
	l.refresh(ctx)
	l.log.Info("lease regained: this server registered again and claims jobs; of its jobs, those no other server adopted are its again",
		"server", l.me.ID, "lease", l.cfg.TTL, "jobs_taken_back", back)
}

// refresh reads the servers' leases.
func (l *leaser) refresh(ctx context.Context) {
	srvs, _, err := l.store.Servers(ctx)
	if err != nil {
		l.log.Warn("read servers", "err", err)
		return
	}
	m := make(map[string]delegate.Server, len(srvs))
	for _, s := range srvs {
		m[s.ID] = s
	}
	l.mu.Lock()
	l.servers, l.seen = m, time.Now()
	l.mu.Unlock()
	if m[l.me.ID].Draining && !l.draining.Swap(true) {
		l.log.Info("draining: this server takes no new jobs; its running jobs go on (stop it to hand them over at once)")
	}
}

// now is this host's clock brought to the store's.
func (l *leaser) now() time.Time { return l.cfg.Clock().Add(time.Duration(l.offset.Load())).UTC() }

// server is what the last read says of a server.
func (l *leaser) server(id string) (delegate.Server, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.servers[id]
	return s, ok
}

// alive says whether the engine owner may still be driving its jobs: by
// its lease (as last read, on the store's clock), and by its process when
// it is on this host (a server gone from here is dead at once).
func (l *leaser) alive(owner string) bool {
	if owner == l.me.ID {
		return !l.dead.Load()
	}
	s, ok := l.server(owner)
	if !ok {
		return l.fallback(owner)
	}
	if !s.Live || l.sameHost(s, owner) && !l.fallback(owner) {
		return false // an expired lease is never renewed
	}
	return l.now().Before(s.ExpiresAt)
}

// sameHost says whether server s, which owner names, runs on this host, in
// this pid namespace: its process can be looked at.
func (l *leaser) sameHost(s delegate.Server, owner string) bool {
	host, _ := os.Hostname()
	return s.HostID == l.me.HostID && strings.HasPrefix(owner, host+"/")
}

// hostOf says on which host an owner ran, from its lease or its name.
func (l *leaser) hostOf(owner string) (hostID, name string) {
	if s, ok := l.server(owner); ok {
		return s.HostID, s.Host
	}
	name, _, _ = strings.Cut(owner, "/")
	return "", name
}

// onThisHost says whether owner ran on this host.
func (l *leaser) onThisHost(owner string) bool {
	id, name := l.hostOf(owner)
	if id != "" {
		return id == l.me.HostID
	}
	host, _ := os.Hostname()
	return name == host && os.Getenv("DELEGATE_HOST_ID") == ""
}

// hold records that this server drives job id at epoch.
func (l *leaser) hold(id string, epoch int64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.held[id] = delegate.Fence{Owner: l.me.ID, Epoch: epoch}
	delete(l.lost, id)
	l.mu.Unlock()
}

// admit refuses new work once the lease is not trusted.
func (l *leaser) admit() error {
	switch {
	case l == nil:
		return nil
	case l.draining.Load():
		return fmt.Errorf("server %s is draining and takes no new jobs: send the request to another server: %w", l.me.ID, delegate.ErrConflict)
	case l.trusted():
		return nil
	}
	// A conflict (of the request with this server's state), not
	// unavailable: the client is told, in these words, to go elsewhere.
	return fmt.Errorf("server %s lost its lease in the shared store and takes no new jobs: send the request to another server: %w",
		l.me.ID, delegate.ErrConflict)
}

// release forgets job j, which ended as the store has it (or was never
// stored), unless it ended under another server's fence (another server
// adopted the job, then ended it) while this server still holds it at its
// own epoch: that fence is kept, so that the next write of this server's
// run of the job goes to the store at the old epoch and is refused as
// fenced (counted, the job given up), as it is when this server writes
// before it hears of the end. Forgotten, the fence would let that write
// go unfenced, as if the job were not this server's to drive.
func (l *leaser) release(j *delegate.Job) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, held := l.held[j.ID]; held && (j.Owner != f.Owner || j.Epoch != f.Epoch) {
		return
	}
	delete(l.held, j.ID)
}

type unfencedKey struct{}

// notOwner marks ctx as a write that is not the job owner's (a cancel, a
// callback from the job, an answer): the state machine alone decides it.
func notOwner(ctx context.Context) context.Context {
	return context.WithValue(ctx, unfencedKey{}, true)
}

// fence is ctx with the fence of job id if this server drives it; an
// error when this server may no longer write as its owner.
func (l *leaser) fence(ctx context.Context, id string) (context.Context, error) {
	if l == nil || ctx.Value(unfencedKey{}) != nil {
		return ctx, nil
	}
	l.mu.Lock()
	f, held := l.held[id]
	lost := l.lost[id]
	l.mu.Unlock()
	switch {
	case lost:
		return ctx, fmt.Errorf("job %s: this server gave it up (%w)", id, delegate.ErrFenced)
	case !held:
		return ctx, nil
	case !l.trusted():
		return ctx, fmt.Errorf("job %s: this server's lease is not trusted any more: %w", id, delegate.ErrLeaseLost)
	}
	return delegate.WithFence(ctx, f), nil
}

// refused handles a write of job id's owner that the store (or the lease)
// refused: counted, logged, and the job given up.
func (l *leaser) refused(id string, err error) {
	if l == nil || !(delegate.IsFenced(err) || errors.Is(err, delegate.ErrLeaseLost)) {
		return
	}
	l.fencedWrites.Add(1)
	l.mu.Lock()
	first := !l.lost[id]
	l.lost[id] = true
	delete(l.held, id) // fence refuses it as lost from now on
	l.mu.Unlock()
	if !first {
		return
	}
	l.log.Warn("write fenced: this server no longer holds the job (another adopted it, or its own lease is not trusted); it stops driving it",
		"job", id, "err", err)
	l.giveUp(id)
	if errors.Is(err, delegate.ErrLeaseLost) {
		l.lose(err.Error())
	}
}

// gaveUp says whether this server gave job id up.
func (l *leaser) gaveUp(id string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost[id]
}

// deadOwners are the servers the last read knows whose leases expired.
func (l *leaser) deadOwners() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, s := range l.servers {
		if id != l.me.ID && !l.now().Before(s.ExpiresAt) {
			out = append(out, id)
		}
	}
	return out
}

// stats is what /metrics shows.
func (l *leaser) stats() ServerStats {
	l.mu.Lock()
	age := time.Since(l.lastOK)
	l.mu.Unlock()
	return ServerStats{ID: l.me.ID, Live: l.trusted(), LeaseAge: age, Adoptions: l.adoptions.Load(),
		FencedWrites: l.fencedWrites.Load(), PoolKeeper: l.pool.Load()}
}

// stop ends the lease (a server that stops): its jobs are adopted at once,
// without waiting for the lease to run out.
func (l *leaser) stop(ctx context.Context) {
	l.stopped.Store(true)
	if l.dead.Swap(true) {
		return
	}
	if t := l.poolTerm.Load(); t != nil {
		if err := l.store.ResignTerm(ctx, *t); err != nil {
			l.log.Warn("resign the warm pool", "err", err)
		}
	}
	if err := l.store.ExpireServer(ctx, l.me.ID); err != nil {
		l.log.Warn("end lease", "err", err)
	}
}

// poolDuty is the name of the warm pool keeper's term.
const poolDuty = "warm-pool"

// keepPoolTerm takes or renews the warm pool's term, when a pool asked:
// one server at a time keeps the pool.
func (l *leaser) keepPoolTerm(ctx context.Context) {
	if !l.wantPool.Load() {
		return
	}
	t, err := l.store.AcquireTerm(ctx, poolDuty, l.me.ID, l.cfg.TTL)
	var held *delegate.TermHeldError
	switch {
	case err == nil:
		if !l.pool.Swap(true) {
			l.log.Info("this server keeps the warm pool", "term", t.Term)
		}
		l.poolTerm.Store(&t)
	case errors.As(err, &held):
		if l.pool.Swap(false) {
			l.log.Warn("the warm pool is another server's now", "holder", held.Term.Holder)
		}
	default:
		l.log.Warn("warm pool term", "err", err)
	}
}

// givenUp says whether err refused a write because this server no longer
// holds the job (fenced, or its lease lost): not to be retried.
func givenUp(err error) bool {
	return delegate.IsFenced(err) || errors.Is(err, delegate.ErrLeaseLost)
}

// appendOutput stores a job's output as its owner: fenced when servers
// share the store.
func (r *follower) appendOutput(ctx context.Context, id string, chunk []delegate.Output, read int64) error {
	ctx, err := r.jobs.lease.fence(ctx, id)
	if err == nil {
		err = r.store.AppendOutput(ctx, id, chunk, read)
	}
	r.jobs.lease.refused(id, err)
	return err
}

// addArtifact records an artifact as the job's owner: fenced when servers
// share the store.
func (r *finisher) addArtifact(ctx context.Context, id string, a delegate.Artifact) error {
	ctx, err := r.jobs.lease.fence(ctx, id)
	if err == nil {
		err = r.store.AddArtifact(ctx, id, a)
	}
	r.jobs.lease.refused(id, err)
	return err
}

// wall is the time to stamp what another server may judge (a heartbeat):
// the store's clock where servers share it, else this host's.
func (l *leaser) wall() time.Time {
	if l == nil {
		return time.Now().UTC()
	}
	return l.now()
}

// newStartToken names one start of a job's command.
func newStartToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recordStart records a start token on a job about to start its command.
func (r *starter) recordStart(ctx context.Context, id string) error {
	_, err := r.jobs.update(ctx, id, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job became %s: %w", j.Status, delegate.ErrTerminal)
		}
		j.StartToken = newStartToken()
		return nil
	})
	return err
}
