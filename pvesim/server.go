package pvesim

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/sandbox"
)

// Server is a simulated Proxmox VE cluster behind one HTTPS API endpoint.
type Server struct {
	opts    Options
	schema  *Schema
	log     *slog.Logger
	cert    tls.Certificate
	certPEM []byte
	fp      string
	backend sandbox.Backend
	ownDir  string // a sandbox dir we created, removed by Close
	disks   *diskStore

	ctx       context.Context // ends when the server closes: tasks stop
	cancel    context.CancelFunc
	wg        sync.WaitGroup // tasks and guest work in flight
	closeOnce sync.Once
	closeErr  error

	rel   release
	locks *lockTable

	mu       sync.Mutex
	nodes    []*simNode
	vms      map[int]*vm
	tasks    map[string]*task
	access   *userConfig // users, tokens, roles, ACLs, pools
	storages []*storage
	files    []storageFile // ISO images, templates, backups (AddVolume)
	// storageDigest is storage.cfg's digest, as GET /storage reports it.
	storageDigest string
	// stats is pvestatd's last broadcast (nil: figures are live).
	stats *statsSnapshot
	// offlineSince is when each offline node went away.
	offlineSince map[string]time.Time
	faults       Faults
	rng          *rand.Rand
	requests     []Request
	pidSeq       int
	snapSeq      int // snapshots made so far (their order)
	closed       bool
	// clusterFW and nodeFW are the datacenter's and the nodes' firewall
	// options (firewall.go).
	clusterFW map[string]string
	nodeFW    map[string]map[string]string
	// haMaintenance are the nodes in HA maintenance mode (ha.go), and
	// nodeNotes their notes (their config's description).
	haMaintenance map[string]bool
	nodeNotes     map[string]string
	// secGroups are the datacenter's security groups (secgroups.go).
	secGroups map[string]*secGroup
	// fwActive is every VM's firewall as pve-firewall's last cycle
	// compiled it (network.go).
	fwActive map[int]*compiledFW
	// sandboxes are the guest sandboxes that exist, by id.
	sandboxes map[string]bool
	// workers are each node's pvedaemon workers (a semaphore); inflight
	// and peak count the calls to each node in flight (PeakCalls).
	workers        map[string]chan struct{}
	inflight, peak map[string]int
	// agentBin is the host's qemu-ga, which guests run; "" when guests
	// run the shell emulation. guestDir holds the local sandboxes of the
	// guests (their workspaces are reached from the host there).
	agentBin, agentVersion, guestDir string

	srv *http.Server
	ln  net.Listener
	url string
}

type simNode struct {
	name    string
	cpus    int
	mem     int64
	started time.Time
}

// AgentKind says what runs the guests' agents: "qemu-ga <version>" (the
// real QEMU guest agent) or "emulation" (a shell emulation, where
// qemu-guest-agent is not installed).
func (s *Server) AgentKind() string {
	if s.agentBin == "" {
		return "emulation"
	}
	return "qemu-ga " + s.agentVersion
}

// Request is one API request as the simulator received it.
type Request struct {
	Time    time.Time
	Method  string
	Path    string // below /api2/json, e.g. /nodes/pve1/qemu/100/clone
	Params  Params // query and body, merged (path parameters not included)
	TokenID string // "" when not authenticated
	Status  int
	Reason  string // the HTTP reason phrase (Proxmox's message)
	// Queued is how long it waited for a pvedaemon worker.
	Queued time.Duration
}

// New prepares a simulator; Start serves it.
func New(opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	rel, err := parseRelease(opts.PVEVersion)
	if err != nil {
		return nil, err
	}
	schema, err := loadSchemaFor(rel.major)
	if err != nil {
		return nil, err
	}
	if opts.StorageLockHold == 0 {
		opts.StorageLockHold = opts.TaskDelay / 4
		if d, ok := opts.TaskDelays["qmclone"]; ok {
			opts.StorageLockHold = d / 4
		}
	}
	var storages []*storage
	for _, spec := range opts.Storages {
		st, err := newStorage(spec)
		if err != nil {
			return nil, err
		}
		for _, other := range storages {
			if other.id == st.id {
				return nil, fmt.Errorf("pvesim: storage %s defined twice", st.id)
			}
		}
		storages = append(storages, st)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	seen := map[string]bool{}
	for _, n := range opts.Nodes {
		if err := formats["pve-node"](n.Name); err != nil || seen[n.Name] {
			return nil, fmt.Errorf("pvesim: bad or duplicate node name %q", n.Name)
		}
		if n.CPUs < 1 || n.MemoryBytes < 1<<30 {
			return nil, fmt.Errorf("pvesim: node %s needs at least 1 CPU and 1 GiB", n.Name)
		}
		seen[n.Name] = true
	}
	cert, certPEM, err := selfSigned(opts.Hostnames)
	if err != nil {
		return nil, fmt.Errorf("pvesim: certificate: %w", err)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	s := &Server{
		opts: opts, schema: schema, log: log, cert: cert, certPEM: certPEM,
		fp:           fingerprint(cert.Certificate[0]),
		rel:          rel,
		locks:        newLockTable(),
		vms:          map[int]*vm{},
		tasks:        map[string]*task{},
		access:       newUserConfig(rel.major),
		storages:     storages,
		sandboxes:    map[string]bool{},
		workers:      map[string]chan struct{}{},
		inflight:     map[string]int{},
		peak:         map[string]int{},
		offlineSince: map[string]time.Time{},
		clusterFW:    map[string]string{}, // the datacenter's firewall is off until enabled
		nodeFW:       map[string]map[string]string{},
		secGroups:    map[string]*secGroup{},
		rng:          rand.New(rand.NewPCG(uint64(seed), uint64(seed>>1)|1)),
		pidSeq:       0x1000,
	}
	for _, p := range opts.Pools {
		s.access.pools[p] = &simPool{vms: map[int]bool{}}
	}
	sum := sha1.Sum([]byte(fmt.Sprint(opts.Storages)))
	s.storageDigest = hex.EncodeToString(sum[:])
	for _, n := range opts.Nodes {
		s.nodes = append(s.nodes, &simNode{name: n.Name, cpus: n.CPUs, mem: n.MemoryBytes, started: time.Now()})
	}
	s.setFaults(opts.Faults)
	s.backend = opts.Backend
	s.disks = newDiskStore("")
	if s.backend == nil {
		dir := opts.SandboxDir
		if dir == "" {
			if dir, err = os.MkdirTemp("", "pvesim-guests-"); err != nil {
				return nil, fmt.Errorf("pvesim: %w", err)
			}
			s.ownDir = dir
		}
		// Guests with a NIC reach the network through the simulator's
		// (network.go), the local backend's egress namespace.
		b, err := local.New(local.Config{Dir: dir, Logger: log.With("component", "guests"), Egress: guestNet{s},
			EgressCallbackPort: opts.CallbackPort})
		if err != nil {
			if s.ownDir != "" {
				os.RemoveAll(s.ownDir)
			}
			return nil, fmt.Errorf("pvesim: guests need the local sandbox backend: %w", err)
		}
		s.backend = b
		// The real agent's socket is reached through the sandbox's
		// workspace on the host: only in sandboxes of our own backend.
		s.guestDir = dir
		ddir, err := os.MkdirTemp("", "pvesim-disks-")
		if err != nil {
			if s.ownDir != "" {
				os.RemoveAll(s.ownDir)
			}
			return nil, fmt.Errorf("pvesim: %w", err)
		}
		s.disks = newDiskStore(ddir)
		if !opts.AgentEmulation {
			s.agentBin = qgaBinary()
		}
	}
	if s.agentBin != "" {
		s.agentVersion = qgaVersion(s.agentBin)
		log.Info("pvesim: guests run the real QEMU guest agent", "qemu-ga", s.agentBin, "version", s.agentVersion)
	} else {
		log.Warn("pvesim: guests run a shell emulation of the QEMU guest agent: install Debian's qemu-guest-agent for the real one")
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start listens and serves in the background until Close (or ctx ends).
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("pvesim: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler: s,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{s.cert},
			MinVersion:   tls.VersionTLS12,
			NextProtos:   []string{"http/1.1"},
		},
		// pveproxy speaks HTTP/1.1 only, and the reason phrases Proxmox
		// puts its messages in do not exist in HTTP/2.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	s.url = "https://" + net.JoinHostPort(host, port)
	go func() {
		if err := s.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("pvesim serve", "err", err)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.ctx.Done():
		}
	}()
	s.runStats()
	s.mu.Lock()
	s.compileFirewall()
	s.mu.Unlock()
	s.runFirewall()
	s.log.Info("pvesim listening", "url", s.url, "fingerprint", s.fp, "nodes", len(s.nodes), "pve", s.rel.version)
	return nil
}

// Close stops serving, ends tasks, stops every VM and removes the
// sandboxes of their guests. Every caller returns once that is done
// (Start's watcher of its ctx may be closing at the same time).
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Server) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	var err error
	if s.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.srv.Shutdown(ctx)
		cancel()
	}
	s.wg.Wait() // tasks and boots see s.ctx end and return
	s.mu.Lock()
	var guests []*guest
	for _, v := range s.vms {
		if v.status == "running" {
			if g := s.halt(v); g != nil {
				guests = append(guests, g)
			}
		}
	}

	// Every guest's sandbox, and any a cut-short boot left.
	ids := slices.Collect(maps.Keys(s.sandboxes))
	s.mu.Unlock()
	for _, g := range guests {
		g.agent.close()
	}
	for _, id := range ids {
		s.dropSandbox(id)
	}
	if s.ownDir != "" {
		os.RemoveAll(s.ownDir)
	}
	if s.disks.dir != "" {
		os.RemoveAll(s.disks.dir)
	}
	return err
}

// URL is the API's base, e.g. https://127.0.0.1:41234 (requests go to
// URL()+"/api2/json/...").
func (s *Server) URL() string { return s.url }

// Fingerprint is the SHA-256 fingerprint of the server certificate, as
// Proxmox prints it (AA:BB:...).
func (s *Server) Fingerprint() string { return s.fp }

// CertificatePEM is the self-signed server certificate.
func (s *Server) CertificatePEM() []byte { return slices.Clone(s.certPEM) }

// Schema returns the schema the simulator checks requests against.
func (s *Server) Schema() *Schema { return s.schema }

// AddToken registers an API token whose privileges hold on every path:
// its user is created if needed (root@pam always exists), the token is
// privilege-separated, and both get, on "/" with propagation, the
// built-in role with exactly these privileges (in any release's form:
// RoleAdministrator is Administrator) or else a role "token-<user>-<name>"
// made for them. Its ID is "user@realm!name".
func (s *Server) AddToken(t Token) error {
	userid, name, ok := splitTokenID(t.ID)
	if !ok {
		return fmt.Errorf("pvesim: token id %q is not user@realm!name", t.ID)
	}
	if t.Secret == "" {
		return errors.New("pvesim: token secret is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	role := ""
	want := slices.Sorted(slices.Values(t.Privileges))
	want = slices.Compact(want)
	for _, major := range []int{uc.major, 8, 9} {
		for r, privs := range builtinRoles(major) {
			if r != "NoAccess" && len(privs) == len(want) && !slices.ContainsFunc(want, func(p string) bool { return !privs[p] }) {
				role = r
				break
			}
		}
		if role != "" {
			break
		}
	}
	if role == "" {
		role = "token-" + strings.NewReplacer("@", "-", "!", "-").Replace(t.ID)
		privs := map[string]bool{}
		for _, p := range want {
			if !validPrivileges(uc.major)[p] {
				return fmt.Errorf("pvesim: token %s: privilege %s does not exist in PVE %s", t.ID, p, s.rel.name)
			}
			privs[p] = true
		}
		uc.roles[role] = privs
	}
	u := uc.users[userid]
	if u == nil {
		u = &simUser{enable: true, tokens: map[string]*simToken{}}
		uc.users[userid] = u
	}
	u.tokens[name] = &simToken{privsep: true, secret: t.Secret}
	uc.grant("/", role, t.ID, true, true)
	if userid != "root@pam" {
		uc.grant("/", role, userid, false, true)
	}
	return nil
}

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setFaults(f)
}

// Faults returns the injected faults.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.clone()
}

// SetNodeOnline takes a node offline (unreachable) or back online.
func (s *Server) SetNodeOnline(name string, online bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node(name) == nil {
		return fmt.Errorf("pvesim: no node %q", name)
	}
	f := s.faults.clone()
	f.OfflineNodes = slices.DeleteFunc(f.OfflineNodes, func(n string) bool { return n == name })
	if !online {
		f.OfflineNodes = append(f.OfflineNodes, name)
	}
	s.setFaults(f)
	return nil
}

// Requests returns every request received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		r.Params = r.Params.Clone()
		out[i] = r
	}
	return out
}

func (s *Server) node(name string) *simNode {
	for _, n := range s.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// taskDelay is how long a task of that type takes.
func (s *Server) taskDelay(typ string) time.Duration {
	if d, ok := s.opts.TaskDelays[typ]; ok {
		return d
	}
	return s.opts.TaskDelay
}

// ListenNode serves the API on an address of its own for a node, as each
// node's pveproxy does (every node answers for the whole cluster), and
// returns its URL. While the node is offline (SetNodeOnline) its address
// answers nothing: connections are closed at once, as a node that is
// down refuses them.
func (s *Server) ListenNode(node string) (string, error) {
	s.mu.Lock()
	known := s.node(node) != nil
	s.mu.Unlock()
	if !known {
		return "", fmt.Errorf("pvesim: no node %q", node)
	}
	if s.srv == nil {
		return "", errors.New("pvesim: ListenNode before Start")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pvesim: %w", err)
	}
	go func() {
		if err := s.srv.ServeTLS(&nodeListener{Listener: ln, s: s, node: node}, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("pvesim serve", "node", node, "err", err)
		}
	}()
	return "https://" + ln.Addr().String(), nil
}

// nodeListener refuses connections while its node is offline.
type nodeListener struct {
	net.Listener
	s    *Server
	node string
}

func (l *nodeListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.s.mu.Lock()
		down := l.s.faults.offline(l.node)
		l.s.mu.Unlock()
		if !down {
			return c, nil
		}
		c.Close()
	}
}
