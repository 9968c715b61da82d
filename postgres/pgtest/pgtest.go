// Package pgtest runs a real PostgreSQL server for a test binary: Main
// starts one (initdb in a temporary directory, a server on a Unix socket
// there), each test gets a database of its own (New), and the server is
// stopped and its directory removed when the tests end.
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		url := pgtest.New(t) // a fresh, empty database
//		...
//	}
//
// Where PostgreSQL is not installed the tests that call New skip, unless
// DELEGATE_REQUIRE_POSTGRES is set (CI sets it: scripts/test installs
// Debian's postgresql), and then they fail.
//
// initdb and postgres refuse to run as root: as root, they run as the
// postgres user (the Debian package makes it), as `runuser -u postgres`
// would run them, with the server killed if the test binary dies.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL server of the test binary.
type Server struct {
	dir  string // owns data/ and the socket
	port int    // its TCP port on 127.0.0.1 (Options.TCP), or 0
	cmd  *exec.Cmd
	done chan struct{}
	log  string // the server's log file
}

// Options are the server's settings.
type Options struct {
	// Durable keeps PostgreSQL's shipped durability (fsync on,
	// synchronous_commit on) for benchmarks; tests run without fsync.
	Durable bool
	// TCP has the server listen on a loopback TCP port too (OverTCP), as
	// servers on other hosts reach a database; the Unix socket stays.
	TCP bool
	// Settings are more of the server's settings (name to value), each
	// given as -c name=value after the others: a benchmark compares
	// wal_sync_method or commit_delay, which the server reads at start.
	Settings map[string]string
}

var (
	mu      sync.Mutex
	current *Server
	why     error // why there is no server
	dbs     atomic.Int64
)

// Main starts a server, runs the tests, and stops it. It returns the
// exit code of m.Run.
func Main(m *testing.M) int {
	return MainWith(m, Options{})
}

// MainWith is Main with options.
func MainWith(m *testing.M, opts Options) int {
	s, err := Start(opts)
	mu.Lock()
	current, why = s, err
	mu.Unlock()
	code := m.Run()
	if s != nil {
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop:", err)
		}
	}
	return code
}

// Required says whether a test must fail rather than skip without
// PostgreSQL.
func Required() bool { return os.Getenv("DELEGATE_REQUIRE_POSTGRES") != "" }

// New makes an empty database for t on the server Main started and
// returns its URL; it is dropped when t ends.
func New(t testing.TB) string {
	t.Helper()
	mu.Lock()
	s, err := current, why
	mu.Unlock()
	if s == nil {
		if err == nil {
			err = errors.New("pgtest.Main did not run (call it from TestMain)")
		}
		if Required() {
			t.Fatalf("PostgreSQL (DELEGATE_REQUIRE_POSTGRES is set): %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	return s.NewDatabase(t)
}

// URL is the URL of database name on the server.
func (s *Server) URL(name string) string {
	q := url.Values{}
	q.Set("host", s.dir)
	if s.port != 0 {
		q.Set("port", strconv.Itoa(s.port))
	}
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/" + name, RawQuery: q.Encode()}).String()
}

func (s *Server) admin(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// BinDir finds the directory of PostgreSQL's server programs: Debian's
// /usr/lib/postgresql/VERSION/bin (the newest), or where initdb is on
// PATH.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no initdb under /usr/lib/postgresql/*/bin nor on PATH (apt-get install postgresql)")
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Start runs initdb in a new temporary directory and starts a server on a
// Unix socket there (no TCP), and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	// The postgres user must reach the directory: under /tmp when root
	// (TMPDIR may be a directory of root's alone).
	base := ""
	if cred != nil {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "pgtest-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{dir: dir, done: make(chan struct{}), log: filepath.Join(dir, "server.log")}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	listen := ""
	if opts.TCP {
		if s.port, err = freePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		listen = "127.0.0.1"
	}
	args := []string{"-D", data, "-k", dir, "-c", "listen_addresses=" + listen, "-c", "max_connections=200",
		"-c", "shared_buffers=64MB", "-c", "logging_collector=off"}
	if s.port != 0 {
		args = append(args, "-c", "port="+strconv.Itoa(s.port))
	}
	if !opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, name := range slices.Sorted(maps.Keys(opts.Settings)) {
		args = append(args, "-c", name+"="+opts.Settings[name])
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), args...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = serverAttr(cred)
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("postgres: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(s.log)
			os.RemoveAll(dir)
			return nil, fmt.Errorf("postgres exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.log)
			s.Stop()
			return nil, fmt.Errorf("postgres did not accept connections in 60s: %v: %s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// start starts the server from a goroutine locked to a thread of its
// own, which waits for it: the thread lives as long as the server.
// Linux sends the parent death signal (serverAttr) when the parent
// *thread* ends, and the Go runtime ends a thread whenever a goroutine
// locked to it returns: package local's do (a kept sandbox's network
// namespace is made on such a thread), and in the e2e test binary the
// Proxmox simulator's guests are local sandboxes. Started from any
// thread, the server got SIGQUIT whenever the one that forked it was
// later taken and ended that way (TestFaultServersKill in CI: every
// server's job feed "unexpected EOF" as the warm pool was cloned again,
// then no socket; TestServerOutlivesItsStartersThread).
func (s *Server) start() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.cmd.Wait()
		close(s.done)
	}()
	return <-started
}

// credential is the postgres user's when running as root (initdb and
// postgres refuse root), nil otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user (apt-get install postgresql makes it): %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// Stop shuts the server down (fast: open sessions are ended) and removes
// its directory.
func (s *Server) Stop() error {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			s.cmd.Process.Signal(syscall.SIGQUIT)
			<-s.done
		}
	}
	return os.RemoveAll(s.dir)
}

// OverTCP is dbURL, a database of s, reached over loopback TCP (the
// server started with Options.TCP).
func (s *Server) OverTCP(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil || s.port == 0 {
		panic(fmt.Sprintf("pgtest: %q over TCP: not a URL of a server started with Options.TCP", dbURL))
	}
	u.Host, u.RawQuery = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), "sslmode=disable"
	return u.String()
}

// Dir is the server's directory (its data and socket), on the file
// system of its WAL.
func (s *Server) Dir() string { return s.dir }

// freePort is a TCP port on 127.0.0.1 free now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Log is what the server logged so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return strings.TrimSpace(string(b))
}

// Own starts a server for t alone (as Main does for a test binary: t
// skips without PostgreSQL unless DELEGATE_REQUIRE_POSTGRES is set),
// stopped when t ends.
func Own(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		if Required() {
			t.Fatalf("PostgreSQL (DELEGATE_REQUIRE_POSTGRES is set): %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// NewDatabase makes an empty database for t on s and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbs.Add(1))
	// FILE_COPY: a copy of template0's files, faster here than the
	// default (which writes them through the WAL).
	if err := s.admin(context.Background(), "CREATE DATABASE "+name+" TEMPLATE template0 STRATEGY FILE_COPY"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		// FORCE: a handle a test left open must not keep the database.
		if err := s.admin(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.URL(name)
}
