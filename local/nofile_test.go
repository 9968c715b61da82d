//go:build linux

package local

import (
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestJobLimits(t *testing.T) {
	const longMax = 1<<63 - 1
	for _, tc := range []struct {
		name           string
		f              fileBudget
		pids, nofile   int
		hard           uint64
		wantPids, want int
		over           bool
		err            string
	}{
		// A 24 GiB host whose fs.file-max is the kernel's default.
		{"kernel default, 24 GiB", fileBudget{2466174, 2468365, 8}, 0, 0, 20000, 512, 301, false, ""},
		// systemd's LONG_MAX bounds nothing: memory does.
		{"systemd, 24 GiB", fileBudget{longMax, 2468365, 8}, 0, 0, 1 << 20, 512, 301, false, ""},
		{"systemd, 256 GiB", fileBudget{longMax, 26843545, 8}, 0, 0, 1 << 20, 512, 1024, false, ""},
		// A small host: nofile stops at its floor, then pids come down.
		{"systemd, 8 GiB, 16 sandboxes", fileBudget{longMax, 838860, 16}, 0, 0, 1 << 20, 102, 256, false, ""},
		{"2 GiB, floors", fileBudget{longMax, 209715, 8}, 0, 0, 1 << 20, 64, 256, true, ""},
		// Never above the server's own.
		{"low server limit", fileBudget{longMax, 26843545, 8}, 0, 0, 200, 512, 200, false, ""},
		{"operator's pids", fileBudget{2466174, 2468365, 8}, 100, 0, 20000, 100, 1024, false, ""},
		{"operator's both, over", fileBudget{2466174, 2468365, 8}, 4096, 4096, 20000, 4096, 4096, true, ""},
		{"operator's nofile above the server's", fileBudget{2466174, 2468365, 8}, 0, 30000, 20000, 0, 0, false, "DELEGATE_NOFILE"},
		{"negative pids", fileBudget{2466174, 2468365, 8}, -1, 0, 20000, 0, 0, false, "DELEGATE_PIDS_MAX"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pids, nofile, over, err := jobLimits(tc.f, tc.pids, tc.nofile, tc.hard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || pids != tc.wantPids || nofile != tc.want || over != tc.over {
				t.Fatalf("got pids %d nofile %d over %v (%v); want %d %d %v", pids, nofile, over, err, tc.wantPids, tc.want, tc.over)
			}
			if !over && int64(tc.f.Sandboxes)*int64(pids)*int64(nofile) > min(tc.f.FileMax, tc.f.MemDefault)/2 {
				t.Errorf("%d sandboxes × %d × %d is over half the table", tc.f.Sandboxes, pids, nofile)
			}
		})
	}
}

// runNoFile is the test binary's "nofile" helper: its limits, then how
// many descriptors it could add to the three it has.
func runNoFile() int {
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
	n := 0
	var err error
	for {
		if _, err = unix.Dup(1); err != nil {
			break
		}
		n++
	}
	fmt.Printf("soft %d hard %d opened %d (%v)\n", rl.Cur, rl.Max, n, err)
	return 0
}

// TestJobNoFile: a job's processes may hold the backend's RLIMIT_NOFILE
// open files each, soft and hard, whatever the server's (20,000 or more;
// before, the job inherited it), and the backend's choice keeps its
// sandboxes under half of this host's file table.
func TestJobNoFile(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			f, err := hostFileBudget(DefaultSandboxes)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("fs.file-max %d, memory default %d, %d sandboxes: pids %d, nofile %d", f.FileMax, f.MemDefault, f.Sandboxes, b.pidsMax, b.noFile)
			if int64(f.Sandboxes)*int64(b.pidsMax)*int64(b.noFile) > min(f.FileMax, f.MemDefault)/2 && b.noFile > minNoFile {
				t.Errorf("%d sandboxes of %d processes of %d files each can take more than half of the host's table", f.Sandboxes, b.pidsMax, b.noFile)
			}
			sb := create(t, b, defaultSpec())
			exit, out := runHelperIn(t, sb, "nofile")
			want := fmt.Sprintf("soft %d hard %d opened %d (too many open files)\n", b.noFile, b.noFile, b.noFile-3)
			if exit.Code != 0 || out != want {
				t.Errorf("exit %+v, output %q; want %q", exit, out, want)
			}
			if st := stateOf(t, sb); st.NoFile != b.noFile || st.PidsMax != b.pidsMax {
				t.Errorf("state: nofile %d pids %d; want %d %d", st.NoFile, st.PidsMax, b.noFile, b.pidsMax)
			}
		})
	}
}

// TestNoFileNeverAboveServer: a server whose own limit is low gives jobs
// no more, and refuses an operator's setting above it.
func TestNoFileNeverAboveServer(t *testing.T) {
	canRun(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, t.TempDir())
	cmd.Env = []string{testHelperEnv + "=lownofile"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wantContains(t, string(out), "chosen: nofile 100\n", "set 500: local backend: NoFile 500 (DELEGATE_NOFILE) is above this server's own open-file limit, 100")
}

// runLowNoFile is the "lownofile" helper: New under a hard limit of 100.
func runLowNoFile(args []string) int {
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 100, Max: 100}); err != nil {
		fmt.Println(err)
		return 1
	}
	b, err := New(Config{Dir: args[0] + "/a"})
	if err != nil {
		fmt.Println("chosen:", err)
	} else {
		fmt.Println("chosen: nofile " + strconv.Itoa(b.noFile))
	}
	_, err = New(Config{Dir: args[0] + "/b", NoFile: 500})
	fmt.Printf("set 500: %v\n", err)
	return 0
}
