package pgtest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/jackc/pgx/v5"
)

// TestServerOutlivesItsStartersThread: the server is sent SIGQUIT when
// its parent dies (Pdeathsig), and Linux means the parent thread by
// that; the Go runtime ends a thread whenever a goroutine locked to it
// returns, as package local's do in the e2e test binary (the Proxmox
// simulator's guests make network namespaces on such threads). A server
// started from a thread that then ends must keep running: TestFaultServersKill
// lost its PostgreSQL that way in CI (every server's job feed "unexpected
// EOF", then no socket), whenever the thread that forked it was one of
// those.
func TestServerOutlivesItsStartersThread(t *testing.T) {
	type started struct {
		s   *Server
		err error
	}
	tid := make(chan int, 1)
	res := make(chan started, 1)
	onEndingThread(func() {
		tid <- syscall.Gettid()
		s, err := Start(Options{})
		res <- started{s, err}
	})
	thread, r := <-tid, <-res
	if r.err != nil {
		if Required() {
			t.Fatalf("PostgreSQL (DELEGATE_REQUIRE_POSTGRES is set): %v", r.err)
		}
		t.Skipf("no PostgreSQL: %v", r.err)
	}
	t.Cleanup(func() { r.s.Stop() })
	testkit.Eventually(t, 10*time.Second, "the starting thread to end", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", thread))
		return os.IsNotExist(err)
	})
	// Had the thread been the server's parent, its end has signalled the
	// server by now; an immediate shutdown takes it milliseconds.
	select {
	case <-r.s.done:
		t.Fatalf("the server exited when the thread that started it ended:\n%s", r.s.Log())
	case <-time.After(2 * time.Second):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.s.URL("postgres"))
	if err != nil {
		t.Fatalf("the server after its starter's thread ended: %v\n%s", err, r.s.Log())
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
}

// onEndingThread runs fn on a thread that ends when fn returns: locked to
// it, never unlocked. Not the main thread, which the runtime keeps when
// its goroutine returns locked: a goroutine that lands there holds it
// while another runs fn.
func onEndingThread(fn func()) {
	done := make(chan struct{})
	var run func()
	run = func() {
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			go run()
			<-done
			runtime.UnlockOSThread()
			return
		}
		defer close(done)
		fn()
	}
	go run()
}
