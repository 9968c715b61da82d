//go:build linux

package local

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

func TestWorkspaceRel(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"/workspace/a", "a", true},
		{"/workspace/a/b/c.txt", "a/b/c.txt", true},
		{"/workspace//a/./b", "a/b", true},
		{"/workspace/a/../b", "b", true},
		{"/workspace", "", false},
		{"/workspace/", "", false},
		{"/workspace/..", "", false},
		{"/workspace/../etc/passwd", "", false},
		{"/workspacefoo/a", "", false},
		{"/etc/passwd", "", false},
		{"workspace/a", "", false},
		{"", "", false},
		{"/workspace/a\x00", "", false},
	}
	for _, tt := range tests {
		got, err := workspaceRel(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("workspaceRel(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	in := `22 27 0:21 / /proc rw,relatime - proc proc rw
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:7 - cgroup cgroup rw,memory
90 27 0:50 /sub /data/with\040space rw - tmpfs tmpfs\011x rw,size=1024k
`
	got, err := parseMountinfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d entries", len(got))
	}
	if e := got[1]; e.ID != 35 || e.Parent != 31 || e.MountPoint != "/sys/fs/cgroup/memory" || e.FSType != "cgroup" || !hasOption(e.SuperOptions, "memory") {
		t.Errorf("entry 1 = %+v", e)
	}
	if e := got[2]; e.Root != "/sub" || e.MountPoint != "/data/with space" || e.Source != "tmpfs\tx" {
		t.Errorf("escapes: %+v", e)
	}
	if _, err := parseMountinfo(strings.NewReader("garbage\n")); err == nil {
		t.Error("a malformed line was accepted")
	}
}

func TestDetectCgroups(t *testing.T) {
	const hybrid = `31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
`
	const hybridSelf = "8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n"
	const hybridFreezer = "/sys/fs/cgroup/freezer"
	const combinedFreezer = "" // no freezer hierarchy: sandboxes are not paused
	const combined = `32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
`
	const combinedSelf = "3:cpu,cpuacct:/a\n4:memory:/docker/x/y\n8:pids:/a\n"
	const unified = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	files := map[string]string{
		"/sys/fs/cgroup/unified/cgroup.controllers": "hugetlb\n",
		"/sys/fs/cgroup/cgroup.controllers":         "cpuset cpu io memory hugetlb pids rdma misc\n",
	}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, os.ErrNotExist
	}
	tests := []struct {
		name, mounts, self string
		want               cgroupLayout
		wantErr            string
	}{
		{"v1 with a nearly empty unified hierarchy", hybrid, hybridSelf,
			cgroupLayout{1, "/sys/fs/cgroup/memory/process_api/abc", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/pids", hybridFreezer}, ""},
		{"v1 comounted cpu,cpuacct, memory mounted from a sub-group", combined, combinedSelf,
			cgroupLayout{1, "/sys/fs/cgroup/memory/y", "/sys/fs/cgroup/cpu,cpuacct/a", "/sys/fs/cgroup/pids/a", combinedFreezer}, ""},
		{"v2", unified, "0::/system.slice/delegate.service\n",
			cgroupLayout{2, "/sys/fs/cgroup/system.slice/delegate.service", "/sys/fs/cgroup/system.slice/delegate.service", "/sys/fs/cgroup/system.slice/delegate.service", "/sys/fs/cgroup/system.slice/delegate.service"}, ""},
		{"v2 after moving the server into its leaf", unified, "0::/svc/" + serverLeaf + "\n",
			cgroupLayout{2, "/sys/fs/cgroup/svc", "/sys/fs/cgroup/svc", "/sys/fs/cgroup/svc", "/sys/fs/cgroup/svc"}, ""},
		{"no pids controller", strings.ReplaceAll(hybrid, "rw,pids", "rw,devices"), hybridSelf, cgroupLayout{}, "pids"},
		{"nothing", "", "", cgroupLayout{}, "memory, cpu, pids"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mounts, err := parseMountinfo(strings.NewReader(tt.mounts))
			if err != nil {
				t.Fatal(err)
			}
			got, err := detectCgroups(mounts, parseProcCgroup(tt.self), read)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestCgroupSetDirs(t *testing.T) {
	v2 := cgroupSet{Version: 2, Memory: "/a", CPU: "/a", Pids: "/a"}
	v1 := cgroupSet{Version: 1, Memory: "/m", CPU: "/c", Pids: "/p"}
	if got := fmt.Sprint(v2.dirs(), v1.dirs()); got != "[/a] [/m /c /p]" {
		t.Errorf("dirs = %s", got)
	}
}

// jobPathCase is a command lookup and its answer ("" for none).
type jobPathCase struct {
	name, prog string
	env        []string
	want       string
}

// jobPathCases makes a directory of programs and the lookups to try in
// it; both helpers' lookups must give the same answers.
func jobPathCases(t *testing.T) (string, []jobPathCase) {
	dir := t.TempDir()
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{"a/tool", 0o755}, {"b/tool", 0o755}, {"a/data", 0o644}, {"rel/tool2", 0o755}} {
		p := filepath.Join(dir, f.name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, nil, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	return dir, []jobPathCase{
		{"first PATH entry wins", "tool", []string{"PATH=" + a + ":" + b}, filepath.Join(a, "tool")},
		{"first PATH variable wins", "tool", []string{"PATH=" + b, "PATH=" + a}, filepath.Join(b, "tool")},
		{"not executable is skipped", "data", []string{"PATH=" + a}, ""},
		{"relative PATH entry is against the working dir", "tool2", []string{"PATH=rel"}, filepath.Join(dir, "rel/tool2")},
		{"empty PATH entry is the working dir", "tool", []string{"PATH=:" + b}, filepath.Join(b, "tool")},
		{"a slash means no lookup", "./x/y", []string{"PATH=" + a}, "./x/y"},
		{"missing", "nope", []string{"PATH=" + a}, ""},
		{"empty PATH", "tool", []string{"PATH="}, ""},
	}
}

func TestJobPath(t *testing.T) {
	dir, tests := jobPathCases(t)
	for _, tt := range tests {
		got, err := jobPath(tt.prog, tt.env, dir)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("%s: jobPath = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// TestOutputWriter: the Go shim keeps the first limit bytes of both
// streams in the order given, records each change of stream, counts all,
// and makes no file for a job that writes nothing.
func TestOutputWriter(t *testing.T) {
	t.Chdir(t.TempDir()) // the shim's files are relative to its directory
	quiet := &outputWriter{limit: 10}
	quiet.close()
	if _, err := os.Stat(fileOutput); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a quiet job's output file: %v", err)
	}
	w := &outputWriter{limit: 10}
	out, errs := stream{w, sandbox.Stdout}, stream{w, sandbox.Stderr}
	for _, c := range []struct {
		w io.Writer
		s string
	}{{out, "hel"}, {out, "lo "}, {errs, "wor"}, {out, "ld, "}, {errs, "and more"}} {
		if n, err := io.WriteString(c.w, c.s); n != len(c.s) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	w.close()
	data, _ := os.ReadFile(fileOutput)
	outs, err := splitStreams(fileStreams, 0, data)
	if want := "[stdout]hello [stderr]wor[stdout]l"; tagged(outs) != want || err != nil || w.n != 21 {
		t.Errorf("kept %q (%v), counted %d; want %q, 21", tagged(outs), err, w.n, want)
	}
	recs, _ := os.ReadFile(fileStreams)
	if len(recs) != 3*streamRecordSize {
		t.Errorf("%d bytes of stream records, want 3 records", len(recs))
	}
}

// TestCheckNotRoot runs New as an unprivileged user and expects the
// promised explanation.
func TestCheckNotRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		_, err := New(Config{Dir: t.TempDir()})
		if err == nil || err.Error() != needRootReason {
			t.Fatalf("New as non-root: %v", err)
		}
		return
	}
	// Copy the test binary where the unprivileged user can execute it.
	dir, err := os.MkdirTemp("", "delegate-nonroot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, _ := os.Executable()
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "local.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, filepath.Join(dir, "state"))
	cmd.Env = []string{testHelperEnv + "=check"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	if want := "New: " + needRootReason + "\n"; string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
}

func TestValidateCommand(t *testing.T) {
	rec, err := validateCommand(sandbox.Command{Args: []string{"/bin/true"}})
	if err != nil || rec.Dir != "/workspace" || rec.OutputLimit != DefaultOutputLimit {
		t.Errorf("defaults: %+v, %v", rec, err)
	}
	rec, err = validateCommand(sandbox.Command{Args: []string{"x"}, Dir: "/tmp/../workspace/a/", OutputLimit: 5})
	if err != nil || rec.Dir != "/workspace/a" || rec.OutputLimit != 5 {
		t.Errorf("explicit: %+v, %v", rec, err)
	}
}

// TestInitRefusesOutsideSandbox: the hidden init command remounts and
// pivots the root, so run by hand (not as pid 1) it must refuse.
func TestInitRefusesOutsideSandbox(t *testing.T) {
	self, _ := os.Executable()
	out, err := exec.Command(self, initCommand).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != codeSetupFailed || !strings.Contains(string(out), "only as pid 1") {
		t.Errorf("init outside a sandbox: %v, %q", err, out)
	}
}

// TestCloseOnExecListed: the way without close_range marks every
// descriptor from 3 up, and leaves 0, 1 and 2 alone.
func TestCloseOnExecListed(t *testing.T) {
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	before, err := unix.FcntlInt(0, unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := closeOnExecListed(); err != nil {
		t.Fatal(err)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("descriptor %d: flags %#x, %v; want close-on-exec", fd, flags, err)
	}
	if after, err := unix.FcntlInt(0, unix.F_GETFD, 0); err != nil || after != before {
		t.Errorf("descriptor 0: flags %#x, then %#x (%v)", before, after, err)
	}
}

// TestOutputQuiet: a kept sandbox's Go command shim, told that the
// command ended, keeps what the command wrote before its end even when
// its copier has not read it yet (the pipes hold it), and does not wait
// for the pipes' end, which a background process may hold off.
func TestOutputQuiet(t *testing.T) {
	t.Chdir(t.TempDir())
	var outP, errP [2]int
	if err := unix.Pipe2(outP[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Pipe2(errP[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outP[1])
	defer unix.Close(errP[1])
	w := &outputWriter{limit: 1 << 10}
	defer w.close()
	if _, err := unix.Write(outP[1], []byte("up\n")); err != nil {
		t.Fatal(err)
	}
	copied := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond) // the case under test: a copier the scheduler was slow to run
		copyOutput(w, outP[0], errP[0], slog.New(slog.DiscardHandler))
		close(copied)
	}()
	start := time.Now()
	w.quiet(copied, [2]int{outP[0], errP[0]})
	w.mu.Lock()
	n := w.n
	w.mu.Unlock()
	if n != 3 {
		t.Errorf("kept %d bytes when quiet returned, want the 3 written before", n)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("quiet waited %v: for the pipes' end, which a background process holds", d)
	}
}

// TestFillFile: a file made ahead (empty) is filled without a truncation,
// one with content is emptied first, and a missing one is made 0600.
func TestFillFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name   string
		before *string // nil: no file
		flags  int
	}{
		{"made ahead, empty", new(""), os.O_WRONLY},
		{"longer content", new("a record longer than the new one"), os.O_WRONLY},
		{"missing", nil, os.O_WRONLY | os.O_CREATE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if tt.before != nil {
				if err := os.WriteFile(path, []byte(*tt.before), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := fillFile(path, []byte("12345"), tt.flags); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != "12345" {
				t.Fatalf("file holds %q (%v), want %q", got, err, "12345")
			}
			if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v (%v), want 0600", st.Mode(), err)
			}
		})
	}
}
