package proxmox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// vmSandbox is one job's VM.
type vmSandbox struct {
	b     *Backend
	vmid  int
	node  string
	owner owner
}

var _ sandbox.Sandbox = (*vmSandbox)(nil)

func (s *vmSandbox) ID() string { return sandboxID(s.vmid, s.owner.job) }

func (s *vmSandbox) Destroy(ctx context.Context) error {
	return s.b.destroyVM(ctx, s.node, s.vmid, s.owner)
}

// result is how a command run through the agent ended.
type result struct {
	code   int
	stdout []byte
	stderr []byte
}

// run executes argv in the guest (no shell unless argv says so) and waits
// for it.
func (s *vmSandbox) run(ctx context.Context, argv []string) (result, error) {
	pid, err := s.b.c.AgentExec(ctx, s.node, s.vmid, argv, nil)
	if err != nil {
		return result{}, fmt.Errorf("run %s in VM %d: %w", argv[0], s.vmid, err)
	}
	wait := 20 * time.Millisecond
	for {
		st, err := s.b.c.AgentExecStatus(ctx, s.node, s.vmid, pid)
		if err != nil {
			return result{}, fmt.Errorf("run %s in VM %d: %w", argv[0], s.vmid, err)
		}
		if st.Exited {
			r := result{code: -1, stdout: st.Stdout, stderr: st.Stderr}
			if st.ExitCode != nil {
				r.code = *st.ExitCode
			}
			return r, nil
		}
		select {
		case <-ctx.Done():
			return result{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, s.b.cfg.PollInterval)
	}
}

// runOK is run for a command that must succeed.
func (s *vmSandbox) runOK(ctx context.Context, argv []string) ([]byte, error) {
	r, err := s.run(ctx, argv)
	if err != nil {
		return nil, err
	}
	if r.code != 0 {
		return nil, fmt.Errorf("%s in VM %d exited %d: %s", argv[0], s.vmid, r.code, strings.TrimSpace(string(r.stderr)))
	}
	return r.stdout, nil
}

func checkWorkspacePath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || !strings.HasPrefix(p, workspace+"/") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q must be a clean absolute path inside %s", p, workspace)
	}
	return nil
}

// joinScript assembles a file from parts written by the agent. It is a
// constant: the paths and mode arrive as arguments, never inside the script.
const joinScript = `mode=$1 out=$2; shift 2
mkdir -p -- "${out%/*}" && cat -- "$@" > "$out" && chmod "$mode" -- "$out"; rc=$?
rm -f -- "$@"; exit $rc`

// WriteFile implements sandbox.Sandbox. file-write carries at most
// pve.MaxFileWrite bytes and only overwrites, so the file is written in
// parts under guestDir and joined in the guest.
func (s *vmSandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := checkWorkspacePath(p); err != nil {
		return err
	}
	var nonce [6]byte
	rand.Read(nonce[:])
	// /tmp exists in every guest; delegate's own directory is made later.
	prefix := "/tmp/delegate-part-" + hex.EncodeToString(nonce[:]) + "-"
	args := []string{"/bin/sh", "-c", joinScript, "delegate-join", strconv.FormatUint(uint64(mode.Perm()), 8), p}
	for i := 0; i == 0 || i*pve.MaxFileWrite < len(data); i++ {
		part := prefix + strconv.Itoa(i)
		chunk := data[i*pve.MaxFileWrite : min(len(data), (i+1)*pve.MaxFileWrite)]
		if err := s.b.c.AgentFileWrite(ctx, s.node, s.vmid, part, chunk); err != nil {
			return fmt.Errorf("write %s (part %d) in VM %d: %w", p, i, s.vmid, err)
		}
		args = append(args, part)
	}
	if _, err := s.runOK(ctx, args); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// ReadFile implements sandbox.Sandbox (the agent reads at most 16 MiB).
func (s *vmSandbox) ReadFile(ctx context.Context, p string, max int64) ([]byte, error) {
	if err := checkWorkspacePath(p); err != nil {
		return nil, err
	}
	fc, err := s.b.c.AgentFileRead(ctx, s.node, s.vmid, p)
	if err != nil {
		return nil, fmt.Errorf("read %s in VM %d: %w", p, s.vmid, err)
	}
	if int64(len(fc.Data)) > max {
		return fc.Data[:max], nil
	}
	return fc.Data, nil
}

// ListFiles implements sandbox.Sandbox with find(1) in the guest: regular
// files only (-type f does not follow links), NUL-separated.
func (s *vmSandbox) ListFiles(ctx context.Context) ([]sandbox.FileInfo, error) {
	out, err := s.runOK(ctx, []string{"/usr/bin/find", workspace, "-type", "f", "-printf", `%s %p\0`})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", workspace, err)
	}
	var files []sandbox.FileInfo
	for _, rec := range bytes.Split(out, []byte{0}) {
		size, name, ok := strings.Cut(string(rec), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(size, 10, 64)
		if err != nil || checkWorkspacePath(name) != nil {
			continue
		}
		files = append(files, sandbox.FileInfo{Path: name, Size: n})
	}
	return files, nil
}

// runnerScript runs the job's command in /workspace with its output in
// guestOutput and its exit status kept in guestOutput.exit, so that a
// restarted server can still learn how it ended. $0 is the output file;
// the command comes as "$@": nothing of the job is parsed by this shell.
const runnerScript = `cd /workspace || exit 125
"$@" >>"$0" 2>&1 </dev/null
rc=$?
echo "$rc" > "$0.exit"
exit $rc`

// setupScript prepares the status channel: a FIFO the job writes lines to
// (echo "step" > "$DELEGATE_STATUS_FILE") and a reader that keeps them.
const setupScript = `mkdir -p /workspace "${1%/*}" && rm -f -- "$1" "$2" "$3" "$3.exit" && : > "$2" && : > "$3" && mkfifo -m 0666 -- "$1"`

// Exec implements sandbox.Sandbox. The environment is passed with env -i
// as argv elements; QEMU's agent has no other way to set it.
func (s *vmSandbox) Exec(ctx context.Context, cmd sandbox.Command) (sandbox.Process, error) {
	if len(cmd.Args) == 0 {
		return nil, errors.New("exec: empty command")
	}
	for _, kv := range cmd.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("exec: environment entry %q is not KEY=VALUE", k)
		}
	}
	if _, err := s.runOK(ctx, []string{"/bin/sh", "-c", setupScript, "delegate-setup", StatusFile, guestEvents, guestOutput}); err != nil {
		return nil, fmt.Errorf("exec: prepare VM %d: %w", s.vmid, err)
	}
	// The reader never exits by itself: it lives until the VM is destroyed.
	if _, err := s.b.c.AgentExec(ctx, s.node, s.vmid, []string{"/bin/sh", "-c", `exec cat <>"$1" >>"$2"`, "delegate-status", StatusFile, guestEvents}, nil); err != nil {
		return nil, fmt.Errorf("exec: start the status reader in VM %d: %w", s.vmid, err)
	}
	argv := append([]string{"/usr/bin/env", "-i"}, cmd.Env...)
	argv = append(argv, "/bin/sh", "-c", runnerScript, guestOutput)
	argv = append(argv, cmd.Args...)
	pid, err := s.b.c.AgentExec(ctx, s.node, s.vmid, argv, nil)
	if err != nil {
		return nil, fmt.Errorf("exec %s in VM %d: %w", cmd.Args[0], s.vmid, err)
	}
	return &process{s: s, pid: pid}, nil
}

// Process implements sandbox.Sandbox: execID is "pid:N".
func (s *vmSandbox) Process(ctx context.Context, execID string) (sandbox.Process, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(execID, "pid:"))
	if err != nil || !strings.HasPrefix(execID, "pid:") {
		return nil, fmt.Errorf("proxmox: process %q: %w", execID, sandbox.ErrGone)
	}
	return &process{s: s, pid: n}, nil
}

// process is the job's command in a VM.
type process struct {
	s   *vmSandbox
	pid int

	mu     sync.Mutex
	exit   *sandbox.Exit // once known (the agent forgets a pid it reported)
	killed bool
}

func (p *process) ID() string { return "pid:" + strconv.Itoa(p.pid) }

// ReadOutput implements sandbox.Process with tail(1) in the guest.
func (p *process) ReadOutput(ctx context.Context, offset int64, max int) ([]byte, error) {
	return p.readGuestFile(ctx, guestOutput, offset, max)
}

// ReadEvents implements sandbox.Process.
func (p *process) ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error) {
	return p.readGuestFile(ctx, guestEvents, offset, max)
}

func (p *process) readGuestFile(ctx context.Context, file string, offset int64, max int) ([]byte, error) {
	if offset < 0 || max <= 0 {
		return nil, nil
	}
	if p.isKilled() {
		return nil, nil // the VM is stopped: what was read is all there is
	}
	out, err := p.s.runOK(ctx, []string{"/bin/sh", "-c", `tail -c +"$1" -- "$2" 2>/dev/null | head -c "$3"`, "delegate-read",
		strconv.FormatInt(offset+1, 10), file, strconv.Itoa(max)})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (p *process) isKilled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// Wait implements sandbox.Process: poll the agent until the command has
// exited. An agent that stays silent for AgentLostAfter loses the job.
func (p *process) Wait(ctx context.Context) (sandbox.Exit, error) {
	lastSeen := time.Now()
	for {
		p.mu.Lock()
		if p.exit != nil {
			e := *p.exit
			p.mu.Unlock()
			return e, nil
		}
		killed := p.killed
		p.mu.Unlock()
		if killed {
			return p.record(sandbox.Exit{Code: 137, Signal: "killed", Killed: true}), nil
		}
		exit, done, err := p.poll(ctx)
		switch {
		case err == nil && done:
			return p.record(exit), nil
		case err == nil:
			lastSeen = time.Now()
		case pve.IsVMNotRunning(err) || pve.IsNotFound(err):
			if p.isKilled() {
				continue
			}
			return sandbox.Exit{}, fmt.Errorf("VM %d stopped while the job ran: %w", p.s.vmid, err)
		case time.Since(lastSeen) > p.s.b.cfg.AgentLostAfter:
			return sandbox.Exit{}, fmt.Errorf("the guest agent of VM %d has not answered for %s: %w", p.s.vmid, p.s.b.cfg.AgentLostAfter, err)
		}
		select {
		case <-ctx.Done():
			return sandbox.Exit{}, ctx.Err()
		case <-time.After(p.s.b.cfg.PollInterval):
		}
	}
}

// poll asks the agent once. When it no longer knows the pid (a previous
// server saw it exit), the exit status file tells.
func (p *process) poll(ctx context.Context) (sandbox.Exit, bool, error) {
	st, err := p.s.b.c.AgentExecStatus(ctx, p.s.node, p.s.vmid, p.pid)
	if err != nil {
		if pve.IsAgentError(err) && !pve.IsAgentNotRunning(err) {
			if e, ok := p.exitFromFile(ctx); ok {
				return e, true, nil
			}
		}
		return sandbox.Exit{}, false, err
	}
	if !st.Exited {
		return sandbox.Exit{}, false, nil
	}
	e := sandbox.Exit{Code: -1}
	switch {
	case st.ExitCode != nil:
		e.Code = *st.ExitCode
	case st.Signal != nil:
		e.Code, e.Signal = 128+*st.Signal, "signal "+strconv.Itoa(*st.Signal)
	}
	if n, err := p.outputSize(ctx); err == nil {
		e.OutputBytes = n
	}
	return e, true, nil
}

func (p *process) exitFromFile(ctx context.Context) (sandbox.Exit, bool) {
	out, err := p.s.runOK(ctx, []string{"/bin/cat", guestOutput + ".exit"})
	if err != nil {
		return sandbox.Exit{}, false
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return sandbox.Exit{}, false
	}
	e := sandbox.Exit{Code: code}
	if n, err := p.outputSize(ctx); err == nil {
		e.OutputBytes = n
	}
	return e, true
}

func (p *process) outputSize(ctx context.Context) (int64, error) {
	out, err := p.s.runOK(ctx, []string{"/usr/bin/stat", "-c", "%s", guestOutput})
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
}

func (p *process) record(e sandbox.Exit) sandbox.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		p.exit = &e
	}
	return *p.exit
}

// Kill implements sandbox.Process: the VM is stopped at once; the guest
// is not trusted to kill its own processes.
func (p *process) Kill(ctx context.Context) error {
	p.mu.Lock()
	if p.exit != nil || p.killed {
		p.mu.Unlock()
		return nil
	}
	p.killed = true
	p.mu.Unlock()
	// The VM is stopped only if it is still this job's.
	if ok, err := p.s.b.ownedBy(ctx, p.s.node, p.s.vmid, p.s.owner); err != nil || !ok {
		return err
	}
	upid, err := p.s.b.c.StopVM(ctx, p.s.node, p.s.vmid)
	if err == nil {
		err = p.s.b.c.WaitTask(ctx, p.s.node, upid)
	}
	if err != nil && !pve.IsVMNotRunning(err) && !pve.IsNotFound(err) {
		return fmt.Errorf("stop VM %d: %w", p.s.vmid, err)
	}
	return nil
}
