//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
)

// handedRE is the server's log line of a command it ran for the CLI, or
// left to the CLI's own process.
var handedRE = regexp.MustCompile(`msg="(ran a command handed by its process|a handed command is run by its own process)".* pid=(\d+)`)

// handed waits for the server's log to say what became of the command
// of process pid: true when the server ran it, false when it left it.
func handed(t *testing.T, logs *syncBuffer, pid int) bool {
	t.Helper()
	var ran, left bool
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("the server's log of process %d's command", pid), func() bool {
		for _, m := range handedRE.FindAllStringSubmatch(logs.String(), -1) {
			if m[2] == strconv.Itoa(pid) {
				ran, left = ran || strings.HasPrefix(m[1], "ran"), left || !strings.HasPrefix(m[1], "ran")
			}
		}
		return ran || left
	})
	return ran
}

// cli runs the binary as delegateCLIEnv does, and returns its pid too.
func cli(t *testing.T, dataDir string, env []string, args ...string) (stdout, stderr string, code, pid int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code = exitCode(t, cmd)
	return out.String(), errb.String(), code, cmd.Process.Pid
}

var jobIDRE = regexp.MustCompile(`job-[a-z0-9]+`)

// progressLineRE matches what a CLI off a terminal writes as its job
// takes its time: a line per status it saw after a 100 ms wait
// ("delegate: JOB running"), and the durations of its verdict.
var progressLineRE = regexp.MustCompile(`(?m)^delegate: JOB (?:pending|provisioning|running)\n|\d+\.\ds`)

// plainProgress is a CLI's stderr without what depends on how long the
// job took (a loaded host makes a 10 ms job take 150 ms), its job ids
// as JOB: the same command's, handed or not, then compare equal.
func plainProgress(stderr string) string {
	return progressLineRE.ReplaceAllString(jobIDRE.ReplaceAllString(stderr, "JOB"), "")
}

// TestCLIHandOff: with a server serving the data dir, `delegate run` and
// `delegate exec` are run by it (its log says so, for the CLI's pid)
// with the same output, exit codes, standard input and Ctrl-C as in a
// process of their own; what the server cannot run as the CLI would
// (a secret from the CLI's environment) the CLI runs itself.
func TestCLIHandOff(t *testing.T) {
	t.Run("C front end", func(t *testing.T) { testHandOff(t) })
	t.Run("Go front end", func(t *testing.T) {
		// The CGO_ENABLED=0 build: its server and its client both.
		bin, err := goBuild()
		withBinary(t, bin, err)
		testHandOff(t)
	})
}

// goBuild is delegate built with CGO_ENABLED=0 (the Go helpers, the Go
// front end), beside the binary TestMain built, once.
var goBuild = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(filepath.Dir(binary), "delegate-nocgo")
	build := exec.Command("go", "build", "-ldflags", "-X "+versionVar+"="+e2eVersion, "-o", bin, "../cmd/delegate")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	return bin, nil
})

// withBinary runs the rest of the test (a sequential one) with bin as
// the binary under test.
func withBinary(t *testing.T, bin string, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	old := binary
	binary = bin
	t.Cleanup(func() { binary = old })
}

func testHandOff(t *testing.T) {
	dataDir := t.TempDir()
	_, _, logs := startHTTPLogged(t, dataDir, nil)

	// Output and exit code, against the in-process path.
	script := `echo out; echo err >&2; exit 3`
	out, errOut, code, pid := cli(t, dataDir, nil, "run", "--script", script)
	if !handed(t, logs, pid) {
		t.Fatal("the server left run to the CLI")
	}
	out2, errOut2, code2, ownPID := cli(t, dataDir, []string{"DELEGATE_NO_HANDOFF=1"}, "run", "--script", script)
	if code != 3 || out != "out\n" || code2 != code || out2 != out || plainProgress(errOut) != plainProgress(errOut2) {
		t.Errorf("handed: exit %d, stdout %q, stderr %q\nin process: exit %d, stdout %q, stderr %q", code, out, errOut, code2, out2, errOut2)
	}

	// exec with standard input, in a kept sandbox.
	_, errOut, code = delegateCLI(t, dataDir, "run", "-q", "--keep", "--script", "true")
	sbx := regexp.MustCompile(`sbx-[a-z0-9]+`).FindString(errOut)
	if code != 0 || sbx == "" {
		t.Fatalf("run --keep: exit %d, stderr %q", code, errOut)
	}
	t.Cleanup(func() { delegateCLI(t, dataDir, "sandboxes", "release", sbx) })
	cmd := exec.Command(binary, "exec", sbx, "--", "sh", "-c", "cat; exit 7")
	cmd.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
	cmd.Stdin = strings.NewReader("from stdin\n")
	got, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 || string(got) != "from stdin\n" {
		t.Errorf("exec with stdin: %v, stdout %q; want exit 7, \"from stdin\\n\"", err, got)
	}
	if !handed(t, logs, cmd.Process.Pid) {
		t.Error("the server left exec to the CLI")
	}

	// Ctrl-C cancels the job, as in a process of its own.
	cmd = exec.Command(binary, "run", "--script", "echo started; sleep 60")
	cmd.Env = serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	cmd.Process.Signal(os.Interrupt)
	io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 || !strings.Contains(stderr.String(), "cancelled") {
		t.Errorf("Ctrl-C: %v, stderr %q; want exit 130, cancelled", err, stderr.String())
	}

	if !handed(t, logs, cmd.Process.Pid) {
		t.Error("the server left the interrupted run to the CLI")
	}
	// A secret of the CLI's environment: the CLI runs the job itself.
	out, errOut, code, pid = cli(t, dataDir, []string{"DELEGATE_SECRET_HANDOFF_S=the-value"},
		"run", "-q", "--secret", "HANDOFF_S", "--script", `test "$HANDOFF_S" = the-value && echo set`)
	if code != 0 || out != "set\n" || handed(t, logs, pid) {
		t.Errorf("--secret: exit %d, stdout %q, stderr %q, handed off", code, out, errOut)
	}
	// The log is in order: the command of DELEGATE_NO_HANDOFF=1 never
	// reached the server.
	for _, m := range handedRE.FindAllStringSubmatch(logs.String(), -1) {
		if m[2] == strconv.Itoa(ownPID) {
			t.Errorf("DELEGATE_NO_HANDOFF=1 reached the server: %s", m[0])
		}
	}
}

// TestCLIHandOffTerminal: on a terminal, a handed command's output is
// escaped as the CLI's own process escapes it (the server writes to the
// CLI's terminal itself), its verdict after it.
func TestCLIHandOffTerminal(t *testing.T) {
	dataDir := t.TempDir()
	_, _, logs := startHTTPLogged(t, dataDir, nil)
	script := `printf 'red \033[31mred\033[0m clip \033]52;c;aGk=\007 end\n'; printf 'e \033[2J\n' >&2; exit 2`
	onTTY := func(env ...string) (int, string) {
		master, tty := testkit.OpenPTY(t)
		cmd := exec.Command(binary, "run", "--script", script)
		cmd.Env = append(serverEnv(dataDir, "DELEGATE_LOG_LEVEL=warn"), env...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, tty, tty
		var got bytes.Buffer
		done := make(chan struct{})
		go func() { io.Copy(&got, master); close(done) }()
		err := cmd.Run()
		tty.Close()
		// The master reads until the terminal's last holder closes it.
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			master.Close()
			<-done
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, jobIDRE.ReplaceAllString(got.String(), "JOB")
	}
	code, handedOut := onTTY()
	if !strings.Contains(logs.String(), "ran a command handed") {
		testkit.Eventually(t, 10*time.Second, "the server's log of the command", func() bool {
			return strings.Contains(logs.String(), "ran a command handed")
		})
	}
	code2, own := onTTY("DELEGATE_NO_HANDOFF=1")
	// The progress line is drawn, or not, as the job takes its time, and
	// durations differ: compare without them.
	progress := regexp.MustCompile(`\r\x1b\[K(?:[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏][^\r]*)?|\d+\.\ds`)
	if code != 2 || code2 != 2 || progress.ReplaceAllString(handedOut, "") != progress.ReplaceAllString(own, "") ||
		strings.Contains(handedOut, "\x1b]52") || strings.Contains(handedOut, "\x1b[2J") {
		t.Errorf("handed: exit %d %q\nin process: exit %d %q", code, handedOut, code2, own)
	}
}
