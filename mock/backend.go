// Package mock holds hand-written test doubles. Backend is an in-memory
// sandbox backend for testing the engine's logic (state machine races,
// recovery) without real processes: each process runs until the test ends
// it with Finish, or until it is killed. JobService and CallbackService
// stand in for the engine when testing the adapters (MCP, the CLI, the
// dashboard; the callback endpoints).
package mock

import (
	"context"
	"fmt"
	"io/fs"
	"sync"

	"github.com/delegate-dev/delegate/sandbox"
)

// Backend keeps sandboxes in memory. The zero value is not usable: use New.
type Backend struct {
	mu        sync.Mutex
	next      int
	sandboxes map[string]*Sandbox
	// CreateHook, if set, runs inside Create (to block it, or fail it).
	CreateHook func(ctx context.Context, spec sandbox.Spec) error
	// Started receives every process Exec starts.
	Started chan *Process
	// Caps is what Capabilities reports.
	Caps sandbox.Capabilities
}

// New returns an empty backend.
func New() *Backend {
	return &Backend{sandboxes: map[string]*Sandbox{}, Started: make(chan *Process, 100),
		Caps: sandbox.Capabilities{Recover: true, Supervised: true, NetworkEgress: true, StatusFile: "/run/delegate/status"}}
}

var _ sandbox.Backend = (*Backend)(nil)

func (b *Backend) Name() string { return "mock" }

func (b *Backend) Capabilities() sandbox.Capabilities { return b.Caps }

func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if b.CreateHook != nil {
		if err := b.CreateHook(ctx, spec); err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	sb := &Sandbox{b: b, id: fmt.Sprintf("mock-%d", b.next), Spec: spec, Files: map[string][]byte{}}
	b.sandboxes[sb.id] = sb
	return sb, nil
}

func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sb, ok := b.sandboxes[id]; ok {
		return sb, nil
	}
	return nil, sandbox.ErrGone
}

func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]sandbox.Info, 0, len(b.sandboxes))
	for id, sb := range b.sandboxes {
		out = append(out, sandbox.Info{ID: id, JobID: sb.Spec.JobID})
	}
	return out, nil
}

func (b *Backend) Destroy(ctx context.Context, id string) error {
	b.mu.Lock()
	sb := b.sandboxes[id]
	delete(b.sandboxes, id)
	b.mu.Unlock()
	if sb != nil && sb.proc != nil {
		sb.proc.Kill(ctx)
	}
	return nil
}

// Len is how many sandboxes exist.
func (b *Backend) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sandboxes)
}

// Sandbox is an in-memory sandbox.
type Sandbox struct {
	b     *Backend
	id    string
	Spec  sandbox.Spec
	mu    sync.Mutex
	Files map[string][]byte
	proc  *Process
}

func (s *Sandbox) ID() string { return s.id }

func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Files[path] = append([]byte(nil), data...)
	return nil
}

func (s *Sandbox) ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.Files[path]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return data[:min(int64(len(data)), max)], nil
}

func (s *Sandbox) ListFiles(ctx context.Context) ([]sandbox.FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sandbox.FileInfo
	for p, data := range s.Files {
		out = append(out, sandbox.FileInfo{Path: p, Size: int64(len(data))})
	}
	return out, nil
}

func (s *Sandbox) Exec(ctx context.Context, cmd sandbox.Command) (sandbox.Process, error) {
	s.mu.Lock()
	if s.proc != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s already ran a command", s.id)
	}
	p := &Process{Sandbox: s, Cmd: cmd, done: make(chan struct{})}
	s.proc = p
	s.mu.Unlock()
	s.b.Started <- p
	return p, nil
}

func (s *Sandbox) Process(ctx context.Context, execID string) (sandbox.Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || execID != "exec" {
		return nil, sandbox.ErrGone
	}
	return s.proc, nil
}

func (s *Sandbox) Destroy(ctx context.Context) error { return s.b.Destroy(ctx, s.id) }

// Process is a fake process that the test drives.
type Process struct {
	Sandbox *Sandbox
	Cmd     sandbox.Command
	mu      sync.Mutex
	output  []sandbox.Output
	events  []byte
	exit    sandbox.Exit
	done    chan struct{}
	ended   bool
}

func (p *Process) ID() string { return "exec" }

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
		return p.exit, nil
	case <-ctx.Done():
		return sandbox.Exit{}, ctx.Err()
	}
}

func (p *Process) Kill(ctx context.Context) error {
	p.Finish(sandbox.Exit{Code: 137, Signal: "killed", Killed: true})
	return nil
}
