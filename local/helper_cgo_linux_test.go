//go:build linux && cgo

package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCHelperConstants: helper_linux.c keeps its own copy of the names,
// numbers and step codes it shares with this package.
func TestCHelperConstants(t *testing.T) {
	want := fmt.Sprintf("magic=%d version=%d max=%d shim=%s init=%s argv0=%s probe=%s env=%s=%s prefix=%s codes=%d,%d,%d limit=%d path=%s "+
		"files=%s,%s,%s,%s,%s,%s,%s,%s plan_fd=%d netns_fd=%d ops=%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d",
		planMagic, planVersion, maxPlanBytes, shimCommand, initCommand, "delegate-sandbox-init", probeArg, helperSelectEnv, helperSelectC,
		setupPrefix, codeSetupFailed, codeCannotExec, codeNotFound, DefaultOutputLimit, defaultJobPath,
		fileOutput, fileEvents, fileEventsLatest, fileStatusFIFO, fileKilled, fileInitPID, fileExit, fileShimLog, planFD, netnsFD,
		opMount, opMkdir, opTouch, opSymlink, opReadOnly, opPivot, opUnshareCgroup, opHostname, opLoopback,
		opNoCoreDumps, opDropBounding, opSeccomp, opResolvConf)
	if got := cConstants(); got != want {
		t.Errorf("helper_linux.c has\n%s\nwant\n%s", got, want)
	}
	if argv0 := initCmd(nil, nil, nil, 0, 0).Args[0]; argv0 != "delegate-sandbox-init" {
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
