// Package sandboxtest is the sandbox contract (package sandbox) as a test
// suite that every backend runs — the local backend for real, the
// Proxmox backend against the simulator, and Fake, the in-memory backend
// the engine's tests use — so that what a backend promises is checked
// once, the same way, for all of them (as River's riverdrivertest is for
// its database drivers).
package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// Harness tells Run how to make the backend under test.
type Harness struct {
	// New returns the backend under test.
	New func(t *testing.T) sandbox.Backend
	// Spec returns the spec of the sandboxes the suite makes (one the
	// backend accepts: memory, disk, template).
	Spec func() sandbox.Spec
	// Commands: the backend runs real commands (a POSIX shell at
	// /bin/sh, with cat, sleep, and printf). The Fake runs none.
	Commands bool
	// Restart, if set, returns a second backend over the same state, as
	// a server after a restart; Recover is then tested through it.
	Restart func(t *testing.T, b sandbox.Backend) sandbox.Backend
	// Timeout bounds one command's wait (default 60 s).
	Timeout time.Duration
	// Hidden names a directory the backend itself keeps in the workspace
	// (the simulator's guest agent keeps its socket there), which
	// listings leave out here.
	Hidden string
}

// Run runs the contract's tests.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 60 * time.Second
	}
	b := h.New(t)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	s := &suite{h: h, b: b}
	t.Run("lifecycle", s.lifecycle)
	t.Run("files", s.files)
	t.Run("archive", s.archive)
	if h.Commands {
		t.Run("command", s.command)
		if b.Capabilities().MultiExec {
			t.Run("many commands", s.manyCommands)
		}
		if b.Capabilities().Pause {
			t.Run("pause", s.pause)
		}
		if b.Capabilities().MultiExec {
			t.Run("checkpoints", s.checkpoints)
		}
	}
}

type suite struct {
	h Harness
	b sandbox.Backend
}

func (s *suite) spec(job string) sandbox.Spec {
	spec := sandbox.Spec{CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20}
	if s.h.Spec != nil {
		spec = s.h.Spec()
	}
	spec.JobID = job
	return spec
}

func (s *suite) create(t *testing.T, job string) sandbox.Instance {
	t.Helper()
	return s.createWith(t, s.spec(job))
}

// createMulti makes an instance that runs many commands.
func (s *suite) createMulti(t *testing.T, job string) sandbox.Instance {
	t.Helper()
	spec := s.spec(job)
	spec.MultiExec = true
	return s.createWith(t, spec)
}

func (s *suite) createWith(t *testing.T, spec sandbox.Spec) sandbox.Instance {
	t.Helper()
	sb, err := s.b.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { s.b.Destroy(context.Background(), sb.ID()) })
	return sb
}

func listed(t *testing.T, b sandbox.Backend, id string) (sandbox.Info, bool) {
	t.Helper()
	infos, err := b.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, in := range infos {
		if in.ID == id {
			return in, true
		}
	}
	return sandbox.Info{}, false
}

// lifecycle: Create, List, Recover, Destroy, and ErrGone after it.
func (s *suite) lifecycle(t *testing.T) {
	ctx := context.Background()
	sb := s.create(t, "job-lifecycle")
	if sb.ID() == "" {
		t.Fatal("an instance without an id")
	}
	if in, ok := listed(t, s.b, sb.ID()); !ok || in.JobID != "job-lifecycle" {
		t.Errorf("List: %+v, %v; want the instance with its job", in, ok)
	}
	other := s.b
	if s.h.Restart != nil {
		other = s.h.Restart(t, s.b)
	}
	again, err := other.Recover(ctx, sb.ID())
	if err != nil || again.ID() != sb.ID() {
		t.Fatalf("Recover: %v, %v", again, err)
	}
	if _, err := again.Process(ctx, "no-such-exec"); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("Process of an unknown id: %v, want ErrGone", err)
	}
	if err := s.b.Destroy(ctx, sb.ID()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, ok := listed(t, s.b, sb.ID()); ok {
		t.Error("listed after Destroy")
	}
	if _, err := s.b.Recover(ctx, sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("Recover after Destroy: %v, want ErrGone", err)
	}
	if err := s.b.Destroy(ctx, sb.ID()); err != nil {
		t.Errorf("a second Destroy: %v, want none", err)
	}
}

// files: write, read (offsets, binary), list, and the workspace's bounds.
func (s *suite) files(t *testing.T) {
	ctx := context.Background()
	sb := s.create(t, "job-files")
	bin := []byte{0, 1, 2, 0xff, '\n', 0xfe}
	if err := sb.WriteFile(ctx, "/workspace/a/b/bin", bin, 0o640); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := sb.WriteFile(ctx, "/workspace/top.txt", []byte("hello world"), 0o755); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	for _, tc := range []struct {
		path        string
		offset, max int64
		want        string
	}{
		{"/workspace/a/b/bin", 0, 100, string(bin)},
		{"/workspace/top.txt", 6, 100, "world"},
		{"/workspace/top.txt", 0, 5, "hello"},
		{"/workspace/top.txt", 100, 5, ""},
	} {
		got, err := sb.ReadFile(ctx, tc.path, tc.offset, tc.max)
		if err != nil || string(got) != tc.want {
			t.Errorf("ReadFile(%s, %d, %d) = %q, %v; want %q", tc.path, tc.offset, tc.max, got, err, tc.want)
		}
	}
	if _, err := sb.ReadFile(ctx, "/workspace/missing", 0, 10); err == nil {
		t.Error("ReadFile of a missing file: no error")
	}
	for _, p := range []string{"/etc/passwd", "/workspace/../etc/x", "relative", "/workspace"} {
		if err := sb.WriteFile(ctx, p, []byte("x"), 0o644); err == nil {
			t.Errorf("WriteFile(%q) accepted", p)
		}
		if _, err := sb.ReadFile(ctx, p, 0, 10); err == nil {
			t.Errorf("ReadFile(%q) accepted", p)
		}
	}

	list := func(opts sandbox.ListOptions) ([]sandbox.FileInfo, error) {
		out, err := sb.ListFiles(ctx, opts)
		if s.h.Hidden != "" {
			out = slices.DeleteFunc(out, func(f sandbox.FileInfo) bool {
				return f.Path == s.h.Hidden || strings.HasPrefix(f.Path, s.h.Hidden+"/")
			})
		}
		return out, err
	}
	all, err := list(sandbox.ListOptions{})
	if err != nil {
		t.Fatalf("ListFiles: %v", err)
	}
	byPath := map[string]sandbox.FileInfo{}
	for _, f := range all {
		byPath[f.Path] = f
	}
	if f := byPath["/workspace/a/b/bin"]; f.Size != int64(len(bin)) || !f.Mode.IsRegular() || f.Mode.Perm() != 0o640 || f.ModTime.IsZero() {
		t.Errorf("the binary file is listed as %+v", f)
	}
	if f := byPath["/workspace/a"]; !f.Mode.IsDir() {
		t.Errorf("/workspace/a is listed as %+v, want a directory", f)
	}
	if f := byPath["/workspace/top.txt"]; f.Mode.Perm() != 0o755 {
		t.Errorf("top.txt mode %v, want 0755", f.Mode)
	}
	regular, err := list(sandbox.ListOptions{Regular: true})
	if err != nil || len(regular) != 2 {
		t.Errorf("regular files: %+v, %v; want the two", regular, err)
	}
	top, err := list(sandbox.ListOptions{Depth: 1})
	if paths := pathsOf(top); err != nil || !slices.Equal(paths, []string{"/workspace/a", "/workspace/top.txt"}) {
		t.Errorf("depth 1: %v, %v", paths, err)
	}
	sub, err := sb.ListFiles(ctx, sandbox.ListOptions{Dir: "/workspace/a"})
	if paths := pathsOf(sub); err != nil || !slices.Equal(paths, []string{"/workspace/a/b", "/workspace/a/b/bin"}) {
		t.Errorf("under /workspace/a: %v, %v", paths, err)
	}
	limited, err := sb.ListFiles(ctx, sandbox.ListOptions{Limit: 1, Dir: "/workspace/a"})
	if !errors.Is(err, sandbox.ErrTruncated) || len(limited) != 1 {
		t.Errorf("limit 1: %v, %v; want one entry and ErrTruncated", pathsOf(limited), err)
	}
	if _, err := sb.ListFiles(ctx, sandbox.ListOptions{Dir: "/etc"}); err == nil {
		t.Error("ListFiles of /etc accepted")
	}
}

func pathsOf(fs []sandbox.FileInfo) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Path)
	}
	slices.Sort(out)
	return out
}

// run starts a shell script and waits for it.
func (s *suite) run(t *testing.T, sb sandbox.Instance, cmd sandbox.Command) (sandbox.Process, sandbox.Exit) {
	t.Helper()
	p := s.start(t, sb, cmd)
	return p, s.wait(t, p)
}

func (s *suite) start(t *testing.T, sb sandbox.Instance, cmd sandbox.Command) sandbox.Process {
	t.Helper()
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	if cmd.OutputLimit == 0 {
		cmd.OutputLimit = 1 << 20
	}
	p, err := sb.Exec(context.Background(), cmd)
	if err != nil {
		t.Fatalf("Exec %v: %v", cmd.Args, err)
	}
	return p
}

func (s *suite) wait(t *testing.T, p sandbox.Process) sandbox.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.h.Timeout)
	defer cancel()
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return exit
}

// output reads all of a process's kept output, by stream.
func output(t *testing.T, p sandbox.Process) (stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	for off := int64(0); ; {
		outs, err := p.ReadOutput(context.Background(), off, 64<<10)
		if err != nil {
			t.Fatalf("ReadOutput: %v", err)
		}
		if len(outs) == 0 {
			return o.String(), e.String()
		}
		for _, out := range outs {
			off += int64(len(out.Data))
			if out.Stream == sandbox.Stderr {
				e.Write(out.Data)
			} else {
				o.Write(out.Data)
			}
		}
	}
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// command: one command's contract — exit code, streams, environment,
// working directory, inputs and standard input, the output limit, Kill,
// Deadline, and Process after a restart.
func (s *suite) command(t *testing.T) {
	ctx := context.Background()
	sb := s.create(t, "job-command")
	if err := sb.WriteFile(ctx, "/workspace/in.txt", []byte("from a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, exit := s.run(t, sb, sandbox.Command{
		Args:   sh(`cat in.txt; echo "A=$A"; echo err >&2; cat "$DELEGATE_INPUTS/note"; cat; pwd; exit 3`),
		Env:    []string{"PATH=/usr/bin:/bin", "A=b c"},
		Dir:    "/workspace",
		Inputs: map[string][]byte{"note": []byte("a note\n"), "in": []byte("on stdin\n")},
		Stdin:  "in",
	})
	if exit.Code != 3 || exit.Killed || exit.Reason != "" {
		t.Errorf("exit %+v, want code 3", exit)
	}
	stdout, stderr := output(t, p)
	if want := "from a file\nA=b c\na note\non stdin\n/workspace\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	if stderr != "err\n" {
		t.Errorf("stderr %q", stderr)
	}
	if p.ID() == "" {
		t.Error("a process without an id")
	}

	// One command per instance unless the backend says more (MultiExec).
	t.Run("inputs are the job's alone", func(t *testing.T) {
		p, _ := s.run(t, s.create(t, "job-inputs"), sandbox.Command{Args: sh(`stat -c %a "$DELEGATE_INPUTS/secret"`), Inputs: map[string][]byte{"secret": []byte("s")}})
		if out, _ := output(t, p); strings.TrimSpace(out) != "400" {
			t.Errorf("input mode %q, want 400", out)
		}
	})
	t.Run("output limit", func(t *testing.T) {
		p, exit := s.run(t, s.create(t, "job-limit"), sandbox.Command{Args: sh(`i=0; while [ $i -lt 100 ]; do printf 0123456789; i=$((i+1)); done`), OutputLimit: 100})
		out, _ := output(t, p)
		if len(out) != 100 || exit.OutputBytes != 1000 || !exit.Truncated {
			t.Errorf("kept %d bytes, exit %+v; want 100 kept of 1000, truncated", len(out), exit)
		}
	})
	t.Run("kill ends the tree", func(t *testing.T) {
		p := s.start(t, s.create(t, "job-kill"), sandbox.Command{Args: sh(`sleep 300 & sleep 300; echo survived`)})
		time.Sleep(200 * time.Millisecond)
		if err := p.Kill(ctx); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		exit := s.wait(t, p)
		if !exit.Killed || exit.Code == 0 {
			t.Errorf("exit %+v, want killed", exit)
		}
		if out, _ := output(t, p); strings.Contains(out, "survived") {
			t.Error("the command went on after Kill")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		_, exit := s.run(t, s.create(t, "job-deadline"), sandbox.Command{Args: sh(`sleep 300`), Deadline: time.Now().Add(time.Second)})
		if !exit.DeadlineExceeded {
			t.Errorf("exit %+v, want DeadlineExceeded", exit)
		}
	})
	t.Run("process after a restart", func(t *testing.T) {
		other := s.b
		if s.h.Restart != nil {
			other = s.h.Restart(t, s.b)
		}
		again, err := other.Recover(ctx, sb.ID())
		if err != nil {
			t.Fatal(err)
		}
		q, err := again.Process(ctx, p.ID())
		if err != nil {
			t.Fatalf("Process(%s): %v", p.ID(), err)
		}
		exit, err := q.Wait(ctx)
		if err != nil || exit.Code != 3 {
			t.Errorf("the recovered process: %+v, %v; want code 3", exit, err)
		}
		if out, _ := output(t, q); !strings.HasPrefix(out, "from a file\n") {
			t.Errorf("the recovered process's output %q", out)
		}
	})
}

// manyCommands: commands of one instance share its files and network,
// run side by side, and each has an id of its own.
func (s *suite) manyCommands(t *testing.T) {
	sb := s.createMulti(t, "job-many")
	first, exit := s.run(t, sb, sandbox.Command{Args: sh(`echo kept > /workspace/kept.txt; echo kept > /tmp/tmp.txt`)})
	if exit.Code != 0 {
		t.Fatalf("first command: %+v", exit)
	}
	second, exit := s.run(t, sb, sandbox.Command{Args: sh(`cat /workspace/kept.txt /tmp/tmp.txt`)})
	if out, _ := output(t, second); exit.Code != 0 || out != "kept\nkept\n" {
		t.Errorf("the second command read %q (%+v): the first one's files are gone", out, exit)
	}
	if first.ID() == second.ID() {
		t.Errorf("two commands with one id %q", first.ID())
	}
	// A server in the background of one command, a client beside it.
	server := s.start(t, sb, sandbox.Command{Args: sh(`echo up > /workspace/up; sleep 300`)})
	deadline := time.Now().Add(s.h.Timeout)
	for {
		if b, _ := sb.ReadFile(context.Background(), "/workspace/up", 0, 10); string(b) == "up\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background command never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
	beside, exit := s.run(t, sb, sandbox.Command{Args: sh(`cat /workspace/up`)})
	if out, _ := output(t, beside); exit.Code != 0 || out != "up\n" {
		t.Errorf("a command beside a running one: %q, %+v", out, exit)
	}
	server.Kill(context.Background())
	if exit := s.wait(t, server); !exit.Killed {
		t.Errorf("the background command: %+v, want killed", exit)
	}
	// What a command leaves in the background runs on after it ended
	// (its end is not held up by it), until the instance goes. The
	// background waits for a file the test writes only once the command
	// has ended: an end that waited for it would never come (s.run's
	// deadline), and no clock is judged.
	_, exit = s.run(t, sb, sandbox.Command{Args: sh(`(while [ ! -e /workspace/go ]; do sleep 0.05; done; echo late > /workspace/late) >/dev/null 2>&1 & echo started`)})
	if exit.Code != 0 {
		t.Errorf("a command that left a process in the background: %+v", exit)
	}
	if b, _ := sb.ReadFile(context.Background(), "/workspace/late", 0, 10); len(b) != 0 {
		t.Errorf("the background process ended before it was let go: %q", b)
	}
	if _, exit := s.run(t, sb, sandbox.Command{Args: sh(`touch /workspace/go`)}); exit.Code != 0 {
		t.Fatalf("touch /workspace/go: %+v", exit)
	}
	for deadline := time.Now().Add(s.h.Timeout); ; time.Sleep(50 * time.Millisecond) {
		if b, _ := sb.ReadFile(context.Background(), "/workspace/late", 0, 10); string(b) == "late\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background process of an ended command did not go on")
		}
	}
	// Commands share the network: a server on loopback in one, its
	// client in another (where python3 is there to write both).
	srv := s.start(t, sb, sandbox.Command{Args: sh(`command -v python3 >/dev/null || { echo nopython > /workspace/srv; exit 0; }
exec python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765)); s.listen(1)
open("/workspace/srv", "w").write("up")
c, _ = s.accept(); c.sendall(b"pong"); c.close()'`)})
	for deadline := time.Now().Add(s.h.Timeout); ; time.Sleep(50 * time.Millisecond) {
		b, _ := sb.ReadFile(context.Background(), "/workspace/srv", 0, 10)
		if string(b) == "up" || string(b) == "nopython\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the loopback server never started")
		}
	}
	if b, _ := sb.ReadFile(context.Background(), "/workspace/srv", 0, 10); string(b) == "up" {
		cl, exit := s.run(t, sb, sandbox.Command{Args: sh(`exec python3 -c '
import socket
c = socket.create_connection(("127.0.0.1", 8765)); print(c.recv(10).decode())'`)})
		if out, errOut := output(t, cl); exit.Code != 0 || out != "pong\n" {
			t.Errorf("a client beside a loopback server: %q %q %+v", out, errOut, exit)
		}
	}
	s.wait(t, srv)
	// The instance outlives its commands.
	after, exit := s.run(t, sb, sandbox.Command{Args: sh(`echo still here`)})
	if out, _ := output(t, after); exit.Code != 0 || out != "still here\n" {
		t.Errorf("a command after a kill: %q, %+v", out, exit)
	}
}

// pause: a paused instance's commands make no progress; resumed, they go
// on where they were. Nothing is read while it is paused (a suspended
// VM's guest agent answers nothing): a command logs the time every 20
// ms, and the log shows a gap as long as the pause.
func (s *suite) pause(t *testing.T) {
	ctx := context.Background()
	sb := s.createMulti(t, "job-pause")
	pz, ok := sb.(sandbox.Pauser)
	if !ok {
		t.Fatal("Capabilities.Pause, but the instance is no Pauser")
	}
	p := s.start(t, sb, sandbox.Command{Args: sh(`while :; do date +%s%N >> /workspace/ticks; sleep 0.02; done`)})
	defer p.Kill(ctx)
	ticks := func() []int64 {
		b, _ := sb.ReadFile(ctx, "/workspace/ticks", 0, 1<<20)
		var out []int64
		for _, f := range strings.Fields(string(b)) {
			var n int64
			for _, c := range f {
				n = n*10 + int64(c-'0')
			}
			out = append(out, n)
		}
		return out
	}
	deadline := time.Now().Add(s.h.Timeout)
	for len(ticks()) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the ticking command never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	const paused = 600 * time.Millisecond
	if err := pz.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := pz.Pause(ctx); err != nil {
		t.Errorf("a second Pause: %v", err)
	}
	time.Sleep(paused)
	if err := pz.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := pz.Resume(ctx); err != nil {
		t.Errorf("a second Resume: %v", err)
	}
	before := len(ticks())
	for len(ticks()) < before+3 {
		if time.Now().After(deadline) {
			t.Fatal("resumed, the command never went on")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var gap time.Duration
	tt := ticks()
	for i := 1; i < len(tt); i++ {
		gap = max(gap, time.Duration(tt[i]-tt[i-1]))
	}
	if gap < paused*3/4 {
		t.Errorf("the longest gap between ticks is %s: the command did not stop for the %s pause", gap, paused)
	}
}
