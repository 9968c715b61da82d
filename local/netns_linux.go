//go:build linux

package local

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// netnsPool makes empty network namespaces, loopback up, ahead of need:
// making one is the costliest step of a sandbox's start (about half a
// millisecond, and bringing up its loopback another tenth), so a C shim
// joins a ready one instead (plan.Netns) when there is one, and makes its
// own when there is none. The namespaces belong to the host's user
// namespace, not the sandbox's: nothing in the sandbox can reconfigure
// them (not even its init, which never needs to). The sandboxes with
// network, which the Go helpers start, make their own.
type netnsPool struct {
	log   *slog.Logger
	idle  time.Duration // the maker stops after this long unused
	ready chan *os.File

	mu      sync.Mutex
	takes   int // takes so far: the maker starts at the second
	running bool
	failed  bool // making one failed: sandboxes make their own from then on
	closed  bool // close: no maker starts any more
	stop    chan struct{}
	wg      sync.WaitGroup // the maker
}

const (
	netnsPoolSize = 2
	netnsPoolIdle = 10 * time.Second
)

func newNetnsPool(log *slog.Logger) *netnsPool {
	return &netnsPool{log: log, idle: netnsPoolIdle, ready: make(chan *os.File, netnsPoolSize), stop: make(chan struct{})}
}

// take returns a ready namespace, which the caller closes once the shim
// has it, or nil; from the second take on it has the maker running. A
// process that makes one sandbox (a CLI's "delegate run") makes no
// namespace it will not use: two made ahead and torn down unused cost
// more than the one the shim makes (measured: issue 41, item 2).
func (p *netnsPool) take() *os.File {
	var f *os.File
	select {
	case f = <-p.ready:
	default:
	}
	p.start()
	return f
}

func (p *netnsPool) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.takes++
	if p.takes >= 2 && !p.running && !p.failed && !p.closed {
		p.running = true
		p.wg.Go(p.make)
	}
}

// close stops the maker, waits for it, and closes the namespaces nobody
// took; it returns what failed to close.
func (p *netnsPool) close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.wg.Wait()
	var errs []error
	for {
		select {
		case f := <-p.ready:
			errs = append(errs, f.Close())
		default:
			if err := errors.Join(errs...); err != nil {
				return fmt.Errorf("network namespaces made ahead: %w", err)
			}
			return nil
		}
	}
}

// make fills the pool, and stops (closing what nobody took) once it has
// been full for p.idle.
func (p *netnsPool) make() {
	// The namespaces are made one after the other as this thread's own,
	// so it is not given back to the Go scheduler (no UnlockOSThread):
	// it ends with this goroutine.
	runtime.LockOSThread()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	idle := time.NewTimer(p.idle)
	defer idle.Stop()
	for {
		f, err := newNetns()
		if err != nil {
			p.log.Warn("cannot make network namespaces ahead of need; each sandbox makes its own", "err", err)
			p.mu.Lock()
			p.failed = true
			p.mu.Unlock()
			return
		}
		idle.Reset(p.idle)
		select {
		case p.ready <- f:
		case <-p.stop:
			f.Close()
			return // close takes what is ready
		case <-idle.C:
			f.Close()
			for {
				select {
				case f := <-p.ready:
					f.Close()
				default:
					return
				}
			}
		}
	}
}

// newNetns moves the calling thread (locked) into a new network
// namespace, brings its loopback up, and returns a descriptor of it.
func newNetns() (*os.File, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("unshare: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return nil, fmt.Errorf("loopback: %w", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "netns"), nil
}

// pinNetns makes a network namespace (loopback up) and binds it at path,
// so that it lives as long as the binding: a kept sandbox's, which every
// one of its commands joins. It is made on a thread of its own, which
// the runtime discards afterwards (its namespace changed).
func pinNetns(path string) error {
	if err := touch(path); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with us
		f, err := newNetns()
		if err == nil {
			err = unix.Mount(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), path, "", unix.MS_BIND, "")
			f.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}
