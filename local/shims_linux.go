//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shims starts the supervisors of this backend's sandboxes (SelfExe
// __sandbox-shim): a sandbox's shim, a kept sandbox's keeper, and the
// shims of a kept sandbox's commands that the server starts itself; C
// ones where this binary has them and they can do the job, Go ones
// otherwise.
type shims struct {
	selfExe string
	// goHelpers makes every sandbox use the Go helpers, also where the C
	// ones would do (tests run both).
	goHelpers bool
	plans     keeperPlanner
}

// keeperPlanner makes a kept sandbox's plan (planner).
type keeperPlanner interface {
	keeperPlan(dir string, st sandboxState) (*plan, error)
}

// cFor says whether the sandbox's shim (or a kept sandbox's keeper) is
// the C helper. The C helpers build roots without network steps
// (resolv.conf) and start no network helper: a sandbox with network,
// the egress proxy's too, gets the Go ones.
func (sh *shims) cFor(st sandboxState) bool {
	return sh.cCommands() && st.Network == nil && st.Proxy == nil
}

// cCommands says whether the shims of a kept sandbox's commands are C
// ones.
func (sh *shims) cCommands() bool { return haveCHelper && !sh.goHelpers }

// keeperTimeout bounds how long Create waits for a kept sandbox's init to
// have built the sandbox's root (milliseconds, normally).
const keeperTimeout = 30 * time.Second

// startKeeper starts a kept sandbox's supervisor, which starts its init
// (keeper_linux.go), and waits for its word that the sandbox is ready.
func (sh *shims) startKeeper(dir string, st sandboxState) error {
	pl, err := sh.plans.keeperPlan(dir, st)
	if err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join(dir, fileNetns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the sandbox's network namespace: %w", err)
	}
	netns := os.NewFile(uintptr(fd), "netns")
	defer netns.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	shim, err := sh.start(dir, pl, sh.cFor(st), netns, readyW)
	readyW.Close()
	if err != nil {
		return err
	}
	go shim.Wait() // it outlives this call; reaped when it ends while this server runs
	if err := writePIDFile(filepath.Join(dir, fileShimPID), shim.Process.Pid); err != nil {
		return err
	}
	readyR.SetReadDeadline(time.Now().Add(keeperTimeout))
	word, err := io.ReadAll(io.LimitReader(readyR, 4096))
	switch {
	case err != nil:
		return fmt.Errorf("start the sandbox's init: %w", err)
	case string(word) == "ok":
		return nil
	case len(word) == 0:
		return errors.New("start the sandbox's init: its supervisor ended without a word (see shim.log in the sandbox directory)")
	}
	return fmt.Errorf("start the sandbox's init: %s", word)
}

// start starts a shim in dir with the plan, the C one with c, and
// with netns (when the plan says so) the network namespace to join and
// with server the pipe it closes for the server (serverFD). A shim that
// fails later records why in exit.json, which Wait reports.
func (sh *shims) start(dir string, pl *plan, c bool, netns, server *os.File) (*exec.Cmd, error) {
	// The Go shim's stderr is its log (a panic goes there); the C shim
	// opens the log itself when it has something to say.
	var logf *os.File
	if !c {
		var err error
		if logf, err = os.OpenFile(filepath.Join(dir, fileShimLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
			return nil, err
		}
		defer logf.Close()
	}
	planFile, err := planMemfd(pl)
	if err != nil {
		return nil, err
	}
	defer planFile.Close()
	shim := &exec.Cmd{
		Path:       sh.selfExe,
		Args:       []string{sh.selfExe, shimCommand, dir},
		Env:        helperEnv(c),
		Dir:        dir,
		ExtraFiles: []*os.File{planFile}, // planFD
		// A session of its own: signals for the server's process group
		// (Ctrl-C, a service stop) do not reach the job's supervisor.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if logf != nil {
		// Never the server's stdout: that is the MCP channel.
		shim.Stdout, shim.Stderr = logf, logf
	}
	if pl.Netns || server != nil {
		shim.ExtraFiles = append(shim.ExtraFiles, netns) // netnsFD (nil: none)
	}
	if server != nil {
		shim.ExtraFiles = append(shim.ExtraFiles, server) // serverFD
	}
	err = shim.Start()
	if err != nil {
		return nil, fmt.Errorf("start sandbox shim: %w", err)
	}
	return shim, nil
}
