package sandboxtest

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// Fake is an in-memory sandbox backend for testing the engine's logic
// (state machine races, recovery, kept sandboxes) without real
// processes: each process runs until the test ends it with Finish, or
// until it is killed. Its files are a map; it runs no command. It passes
// the parts of Run that need no real command (lifecycle, files, pause).
type Fake struct {
	mu        sync.Mutex
	next      int
	sandboxes map[string]*FakeInstance
	// CreateHook, if set, runs inside Create (to block it, or fail it).
	CreateHook func(ctx context.Context, spec sandbox.Spec) error
	// Started receives every process Exec starts.
	Started chan *Process
	// Caps is what Capabilities reports.
	Caps sandbox.Capabilities
}

// NewFake returns an empty fake backend.
func NewFake() *Fake {
	return &Fake{sandboxes: map[string]*FakeInstance{}, Started: make(chan *Process, 100),
		Caps: sandbox.Capabilities{Recover: true, Supervised: true, NetworkEgress: true, StatusFile: "/run/delegate/status", MultiExec: true, Pause: true, Workspaces: true,
			CheckpointMissing: "the fake backend keeps no checkpoints"}}
}

var _ sandbox.Backend = (*Fake)(nil)

func (b *Fake) Name() string { return "mock" }

func (b *Fake) Capabilities() sandbox.Capabilities { return b.Caps }

func (b *Fake) Close() error { return nil }

func (b *Fake) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	if b.CreateHook != nil {
		if err := b.CreateHook(ctx, spec); err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	sb := &FakeInstance{b: b, id: fmt.Sprintf("mock-%d", b.next), Spec: spec, files: map[string]*fakeFile{}, procs: map[string]*Process{}}
	b.sandboxes[sb.id] = sb
	return sb, nil
}

func (b *Fake) Recover(ctx context.Context, id string) (sandbox.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sb, ok := b.sandboxes[id]; ok {
		return sb, nil
	}
	return nil, sandbox.ErrGone
}

func (b *Fake) List(ctx context.Context) ([]sandbox.Info, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]sandbox.Info, 0, len(b.sandboxes))
	for id, sb := range b.sandboxes {
		out = append(out, sandbox.Info{ID: id, JobID: sb.Spec.JobID})
	}
	return out, nil
}

func (b *Fake) Destroy(ctx context.Context, id string) error {
	b.mu.Lock()
	sb := b.sandboxes[id]
	delete(b.sandboxes, id)
	b.mu.Unlock()
	if sb != nil {
		sb.mu.Lock()
		procs := make([]*Process, 0, len(sb.procs))
		for _, p := range sb.procs {
			procs = append(procs, p)
		}
		sb.gone = true
		sb.mu.Unlock()
		for _, p := range procs {
			p.Kill(ctx)
		}
	}
	return nil
}

// Len is how many sandboxes exist.
func (b *Fake) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sandboxes)
}

// FakeInstance is an in-memory sandbox.
type FakeInstance struct {
	b      *Fake
	id     string
	Spec   sandbox.Spec
	mu     sync.Mutex
	files  map[string]*fakeFile
	procs  map[string]*Process
	n      int
	paused bool
	gone   bool
}

type fakeFile struct {
	data []byte
	mode fs.FileMode
	mod  time.Time
}

func (s *FakeInstance) ID() string { return s.id }

// File returns a file's content as a command would read it.
func (s *FakeInstance) File(p string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.files[p]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), f.data...), true
}

// Paused reports whether the instance is paused.
func (s *FakeInstance) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// checkPath applies the contract's rule for paths: absolute, clean,
// inside /workspace.
func checkPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || !strings.HasPrefix(p, delegate.Workspace+"/") {
		return fmt.Errorf("path %q must be a clean absolute path inside %s", p, delegate.Workspace)
	}
	return nil
}

func (s *FakeInstance) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := checkPath(p); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return sandbox.ErrGone
	}
	for d := path.Dir(p); d != delegate.Workspace; d = path.Dir(d) {
		if f, ok := s.files[d]; ok && !f.mode.IsDir() {
			return fmt.Errorf("write %s: %s is not a directory", p, d)
		}
		if _, ok := s.files[d]; !ok {
			s.files[d] = &fakeFile{mode: fs.ModeDir | 0o755, mod: time.Now()}
		}
	}
	s.files[p] = &fakeFile{data: append([]byte(nil), data...), mode: mode.Perm(), mod: time.Now()}
	return nil
}

func (s *FakeInstance) ReadFile(ctx context.Context, p string, offset, max int64) ([]byte, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil, sandbox.ErrGone
	}
	f, ok := s.files[p]
	if !ok {
		return nil, fmt.Errorf("read %s: %w", p, fs.ErrNotExist)
	}
	if f.mode.IsDir() {
		return nil, fmt.Errorf("read %s: not a regular file", p)
	}
	data := f.data[min(offset, int64(len(f.data))):]
	return append([]byte(nil), data[:min(max, int64(len(data)))]...), nil
}

func (s *FakeInstance) ListFiles(ctx context.Context, opts sandbox.ListOptions) ([]sandbox.FileInfo, error) {
	dir := opts.Dir
	if dir == "" {
		dir = delegate.Workspace
	}
	if dir != delegate.Workspace {
		if err := checkPath(dir); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil, sandbox.ErrGone
	}
	var names []string
	for p := range s.files {
		if rel, ok := strings.CutPrefix(p, dir+"/"); ok && (opts.Depth <= 0 || strings.Count(rel, "/") < opts.Depth) {
			names = append(names, p)
		}
	}
	slices.Sort(names)
	var out []sandbox.FileInfo
	for _, p := range names {
		f := s.files[p]
		if opts.Regular && !f.mode.IsRegular() {
			continue
		}
		if opts.Limit > 0 && len(out) == opts.Limit {
			return out, sandbox.ErrTruncated
		}
		fi := sandbox.FileInfo{Path: p, Size: int64(len(f.data)), Mode: f.mode, ModTime: f.mod}
		if f.mode&fs.ModeSymlink != 0 {
			fi.Link = string(f.data)
		}
		out = append(out, fi)
	}
	return out, nil
}

func (s *FakeInstance) Exec(ctx context.Context, cmd sandbox.Command) (sandbox.Process, error) {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", s.id, sandbox.ErrGone)
	}
	if s.n > 0 && !s.b.Caps.MultiExec {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s already ran a command", s.id)
	}
	s.n++
	id := "exec"
	if s.n > 1 {
		id = fmt.Sprintf("exec-%d", s.n)
	}
	p := &Process{Sandbox: s, Cmd: cmd, id: id, done: make(chan struct{})}
	s.procs[id] = p
	s.mu.Unlock()
	s.b.Started <- p
	return p, nil
}

func (s *FakeInstance) Process(ctx context.Context, execID string) (sandbox.Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[execID]
	if p == nil {
		return nil, sandbox.ErrGone
	}
	return p, nil
}

// Forget drops what the instance knows of a process, as if its record
// were lost while the machine lives on: Process no longer finds it.
func (s *FakeInstance) Forget(execID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, execID)
}

func (s *FakeInstance) Destroy(ctx context.Context) error { return s.b.Destroy(ctx, s.id) }

func (s *FakeInstance) Pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return sandbox.ErrGone
	}
	s.paused = true
	return nil
}

func (s *FakeInstance) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return sandbox.ErrGone
	}
	s.paused = false
	return nil
}

// Process is a fake process that the test drives.
type Process struct {
	Sandbox *FakeInstance
	Cmd     sandbox.Command
	id      string
	mu      sync.Mutex
	output  []sandbox.Output
	events  []byte
	exit    sandbox.Exit
	waitErr error // Wait's error, when its end could not be read
	done    chan struct{}
	ended   bool
}

func (p *Process) ID() string { return p.id }

// Write appends to stdout as if the process wrote it.
func (p *Process) Write(b []byte) { p.WriteStream(sandbox.Stdout, b) }

// WriteStderr appends to stderr as if the process wrote it.
func (p *Process) WriteStderr(b []byte) { p.WriteStream(sandbox.Stderr, b) }

// WriteStream appends output of stream s as if the process wrote it.
func (p *Process) WriteStream(s sandbox.Stream, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.output = sandbox.Append(p.output, s, append([]byte(nil), b...))
	p.exit.OutputBytes += int64(len(b))
}

// Event appends to the status channel as if the job wrote it.
func (p *Process) Event(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, line+"\n"...)
}

// Lose counts n bytes the process wrote that its sandbox did not keep (a
// disk too full to hold them): its exit's OutputBytes says more than its
// output holds.
func (p *Process) Lose(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exit.OutputBytes += n
}

// Finish ends the process with exit.
func (p *Process) Finish(exit sandbox.Exit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	exit.OutputBytes = p.exit.OutputBytes
	p.exit, p.ended = exit, true
	close(p.done)
}

// Fail ends the process with its end unreadable: Wait returns err, as a
// backend's does for a supervisor that died without recording the end,
// or that had no room to record it.
func (p *Process) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.waitErr, p.ended = err, true
	close(p.done)
}

// Killed reports whether Kill ended the process.
func (p *Process) Killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit.Killed
}

func (p *Process) ReadOutput(ctx context.Context, offset int64, n int) ([]sandbox.Output, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var outs []sandbox.Output
	var pos int64 // where the piece starts
	for _, o := range p.output {
		end := pos + int64(len(o.Data))
		if end > offset && n > 0 {
			b := o.Data[max(0, offset-pos):]
			b = b[:min(len(b), n)]
			outs = append(outs, sandbox.Output{Stream: o.Stream, Data: append([]byte(nil), b...)})
			n -= len(b)
		}
		pos = end
	}
	return outs, nil
}

func (p *Process) ReadEvents(ctx context.Context, offset int64, max int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset >= int64(len(p.events)) {
		return nil, nil
	}
	b := p.events[offset:]
	return append([]byte(nil), b[:min(len(b), max)]...), nil
}

func (p *Process) Wait(ctx context.Context) (sandbox.Exit, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.waitErr != nil {
			return sandbox.Exit{}, p.waitErr
		}
		return p.exit, nil
	case <-ctx.Done():
		return sandbox.Exit{}, ctx.Err()
	}
}

func (p *Process) Kill(ctx context.Context) error {
	p.Finish(sandbox.Exit{Code: 137, Signal: "killed", Killed: true})
	return nil
}
