//go:build linux && cgo

package local

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestCHelperConstants: the C helpers (helper_linux.h) keep their own copy
// of the names, numbers and step codes they share with this package.
func TestCHelperConstants(t *testing.T) {
	want := fmt.Sprintf("magic=%d version=%d max=%d shim=%s init=%s argv0=%s probe=%s env=%s=%s prefix=%s codes=%d,%d,%d limit=%d path=%s "+
		"files=%s,%s,%s,%s,%s,%s,%s,%s,%s plan_fd=%d netns_fd=%d ops=%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d",
		planMagic, planVersion, maxPlanBytes, shimCommand, initCommand, "delegate-sandbox-init", probeArg, helperSelectEnv, helperSelectC,
		setupPrefix, codeSetupFailed, codeCannotExec, codeNotFound, DefaultOutputLimit, defaultJobPath,
		fileOutput, fileStreams, fileEvents, fileEventsLatest, fileStatusFIFO, fileKilled, fileInitPID, fileExit, fileShimLog, planFD, netnsFD,
		opMount, opMkdir, opTouch, opSymlink, opReadOnly, opPivot, opUnshareCgroup, opHostname, opLoopback,
		opNoCoreDumps, opDropBounding, opSeccomp, opResolvConf, opInput, opSysctl, opNoFile)
	// A kept sandbox's: its ops, modes, requests and files.
	want += fmt.Sprintf(",%d,%d,%d kept=%d modes=%d,%d,%d request=%d,%d,%d,%d,%d,%d,%d ctl=%c%c%c server_fd=%d files=%s,%s spawn=%d,%d,%s,%s ahead=%c,%d channel=%s",
		opUnshare, opKeepPath, opBindKept, keptSlots, modeSandbox, modeKeeper, modeCommand,
		requestMagic, requestCgroup, requestID, requestSpare, spareMagic, requestFDs, len("ex-")+8, ctlPlaced, ctlGo, ctlKilled, serverFD,
		fileControl, fileJobPID, spawnMagic, spawnFDs, fileShimPID, dirExecs, ctlPlacedAhead, requestKilled, dirChannel)
	if got := cConstants(); got != want {
		t.Errorf("helper_linux.h has\n%s\nwant\n%s", got, want)
	}
	if argv0 := initCmd(nil, nil, nil, nil, 0, 0, true).Args[0]; argv0 != "delegate-sandbox-init" {
		t.Errorf("the Go init's argv[0] is %q", argv0)
	}
}

// TestCJobPath: the C init finds commands as the Go one does, and says
// which PATH it searched.
func TestCJobPath(t *testing.T) {
	dir, tests := jobPathCases(t)
	for _, tt := range tests {
		got, pathEnv := cJobPath(tt.prog, tt.env, dir)
		switch {
		case strings.Contains(tt.prog, "/"):
			if got != tt.prog {
				t.Errorf("%s: C job_path = %q, want it as given", tt.name, got)
			}
		case tt.want == "":
			first := strings.TrimPrefix(tt.env[0], "PATH=")
			if got != "" || pathEnv != first {
				t.Errorf("%s: C job_path = %q searching %q, want none searching %q", tt.name, got, pathEnv, first)
			}
		case filepath.Clean(got) != tt.want: // C does not clean "dir/./x"
			t.Errorf("%s: C job_path = %q, want %q", tt.name, got, tt.want)
		}
	}
	if _, pathEnv := cJobPath("nope", []string{"HOME=/"}, dir); pathEnv != defaultJobPath {
		t.Errorf("no PATH: searched %q, want the default %q", pathEnv, defaultJobPath)
	}
}

// TestCQuote: messages that quote a command read as the Go init's.
func TestCQuote(t *testing.T) {
	for _, s := range []string{"", "true", `a "b" \c`, "tab\there", "new\nline", "ctl\x01\x7f", "é ü"} {
		if got, want := cQuote(s), fmt.Sprintf("%q", s); got != want {
			t.Errorf("C quote(%q) = %s, want %s", s, got, want)
		}
	}
}

// TestCHelperOnlyForShims: the C helpers' check at load time takes only
// a shim's command line; with their variable set, anything else is the
// program as usual.
func TestCHelperOnlyForShims(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestCHelperOnlyForShims$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv(true)...)
	cmd.Env = append(cmd.Env, "DELEGATE_LOCAL_INNER=1")
	if os.Getenv("DELEGATE_LOCAL_INNER") == "1" {
		return // the inner run: reaching this is the proof
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestCHelperOnlyForShims") {
		t.Errorf("the test binary with %s set: %v:\n%s", helperSelectEnv, err, out)
	}
}

// TestCCgroups: the C shim reads a cgroup set as the Go code does, in
// both layouts (v2 is not on every test host: its files are made here).
func TestCCgroups(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "v1")
	v2 := filepath.Join(dir, "v2")
	os.MkdirAll(v1, 0o755)
	os.MkdirAll(v2, 0o755)
	os.WriteFile(filepath.Join(v1, "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644)
	os.WriteFile(filepath.Join(v2, "memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"), 0o644)
	for _, tt := range []struct {
		set  cgroupSet
		ooms int
	}{
		{cgroupSet{Version: 1, Memory: v1, CPU: filepath.Join(dir, "cpu"), Pids: filepath.Join(dir, "pids")}, 3},
		{cgroupSet{Version: 2, Memory: v2, CPU: v2, Pids: v2}, 2},
		{cgroupSet{Version: 2, Memory: filepath.Join(dir, "gone"), CPU: v2, Pids: v2}, -1},
	} {
		dirs, ooms := cCgroups(tt.set)
		if fmt.Sprint(dirs) != fmt.Sprint(tt.set.dirs()) || ooms != tt.ooms {
			t.Errorf("%+v: C has dirs %v and %d OOM kills, want %v and %d", tt.set, dirs, ooms, tt.set.dirs(), tt.ooms)
		}
		if n, err := tt.set.oomKills(); tt.ooms >= 0 && (err != nil || n != tt.ooms) {
			t.Errorf("%+v: Go reads %d OOM kills (%v), want %d", tt.set, n, err, tt.ooms)
		}
	}
}

// TestCHelperDataPages: every C variable with an initial value is named
// in data_written (helper_linux.c), which keeps its page when a waiting
// helper gives back the binary's file-backed data pages (lean_poll): such
// a variable lies there, among pages that hold the file's content, and a
// page given back would undo what the helper wrote to it. (Go's data,
// the loader's tables and the C runtime's are never written in a helper:
// the Go runtime never starts in one.) The C files are compiled here, as
// cgo compiles them, and each object's initialised writable data read.
func TestCHelperDataPages(t *testing.T) {
	cc := strings.Fields(goEnv(t, "CC"))
	if len(cc) == 0 {
		t.Skip("no C compiler")
	}
	src, err := os.ReadFile("helper_linux.c")
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)
	if i := strings.Index(body, "static int data_written("); i >= 0 {
		body = body[i:]
		body = body[:strings.Index(body, "\n}\n")]
	} else {
		t.Fatal("helper_linux.c has no data_written")
	}
	files, err := filepath.Glob("*_linux.c")
	if err != nil || len(files) == 0 {
		t.Fatalf("no C files: %v", err)
	}
	var found []string
	for _, file := range files {
		obj := filepath.Join(t.TempDir(), file+".o")
		args := append(cc[1:], "-O2", "-fno-plt", "-c", "-o", obj, file)
		if out, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", cc[0], args, err, out)
		}
		f, err := elf.Open(obj)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.Symbols()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range syms {
			if s.Section >= elf.SHN_LORESERVE || int(s.Section) >= len(f.Sections) || s.Section == elf.SHN_UNDEF {
				continue
			}
			sec := f.Sections[s.Section]
			if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_WRITE == 0 || sec.Name == ".init_array" || sec.Name == ".fini_array" ||
				elf.ST_TYPE(s.Info) != elf.STT_OBJECT {
				continue
			}
			found = append(found, file+": "+s.Name)
			if !strings.Contains(body, "&"+s.Name) {
				t.Errorf("%s: the C variable %s has an initial value, in the binary's file-backed data: name it in data_written (helper_linux.c), or give it none", file, s.Name)
			}
		}
	}
	if !slices.Contains(found, "helper_linux.c: logfd") {
		t.Errorf("the C variables with initial values found: %q, want logfd among them", found)
	}
}

// goEnv is go env NAME.
func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// TestPIDFileWhole: a pid file, as either helper kind writes it (Go's
// writePIDFile, C's write_pid_file), comes into place whole, by a rename:
// a reader never finds it created and not yet written (the e2e tests read
// one empty in CI once). Its temporary file may have been made ahead,
// empty (a command's directory, aheadFiles), or left by a helper that
// died; the old pid file is replaced. The directory's inotify events show
// the name arriving (IN_MOVED_TO) and nothing else done to it.
func TestPIDFileWhole(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // the C helpers write in their working directory
	writers := []struct {
		kind  string
		write func(name string, pid int) error
	}{{"Go", writePIDFile}, {"C", cWritePIDFile}}
	for i, c := range []struct {
		name        string
		tmp, before string // "-": no such file
	}{
		{"no file before", "-", "-"},
		{"its temporary file made ahead", "", "-"},
		{"a temporary file a dead helper left, an old pid file", "123456789", "99"},
	} {
		for j, w := range writers {
			name := fmt.Sprintf("p%d%d.pid", i, j)
			pid := 4000000 + 10*i + j
			for path, data := range map[string]string{pidTemp(name): c.tmp, name: c.before} {
				if data != "-" {
					if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			events := watchDir(t, dir)
			if err := w.write(name, pid); err != nil {
				t.Fatalf("%s, %s: %v", c.name, w.kind, err)
			}
			if got := events()[name]; !slices.Equal(got, []uint32{unix.IN_MOVED_TO}) {
				t.Errorf("%s, %s: the pid file's events %#x, want only IN_MOVED_TO (%#x)", c.name, w.kind, got, unix.IN_MOVED_TO)
			}
			if data, err := os.ReadFile(name); err != nil || string(data) != strconv.Itoa(pid) {
				t.Errorf("%s, %s: the pid file holds %q (%v), want %d", c.name, w.kind, data, err, pid)
			}
			if _, err := os.Lstat(pidTemp(name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s, %s: its temporary file stayed: %v", c.name, w.kind, err)
			}
		}
	}
}

// watchDir watches dir; the function returned gives the events since, by
// the name of the file each befell, in order.
func watchDir(t *testing.T, dir string) func() map[string][]uint32 {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	return func() map[string][]uint32 {
		out := map[string][]uint32{}
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf) // the events of the calls made are queued as they return
			if errors.Is(err, unix.EAGAIN) {
				return out
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
				out[name] = append(out[name], ev.Mask)
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}
