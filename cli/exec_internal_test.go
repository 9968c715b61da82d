package cli

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestCommandLineRunsArgvExactly: the script commandLine writes, run by a
// real /bin/sh as a job's script is, gives the command exactly the
// arguments it was given, whatever they hold; and a first word the shell
// would read as syntax (a reserved word, an assignment) is a command name.
func TestCommandLineRunsArgvExactly(t *testing.T) {
	hostile := []string{
		"plain", "", " ", "a b", "'", `'\''`, `"`, `\`, `\n`, "two\nlines", "$HOME", "${PATH}", "$(id)", "`id`", ";", "&&", "|", ">f",
		"<f", "*", "?", "[a]", "~", "~root", "#x", "!", "{", "}", "(", ")", "a=b", "--flag=v", "-n", "-e", "%s", "\t", "\x01\x7f",
		"\xff\xfe not utf-8", "café 日本", "if", "then", "done", "'$(rm -rf /)'", "a'b\"c`d$e\\f",
	}
	argv := append([]string{"printf", `%s\0`}, hostile...)
	script, err := commandLine(argv)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range []string{"/bin/sh", "/bin/bash", "/bin/dash"} {
		if _, err := exec.LookPath(sh); err != nil {
			continue
		}
		out, err := exec.Command(sh, "-c", script).Output()
		if err != nil {
			t.Fatalf("%s -c %q: %v", sh, script, err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if len(got) != len(hostile) {
			t.Fatalf("%s: %d arguments arrived, want %d: %q", sh, len(got), len(hostile), got)
		}
		for i := range hostile {
			if got[i] != hostile[i] {
				t.Errorf("%s: argument %d arrived as %q, want %q", sh, i, got[i], hostile[i])
			}
		}
	}

	// Plain words read as typed.
	if s, _ := commandLine([]string{"make", "-j4", "test", "./a/b.go", "x@y:1,2%+"}); s != "make -j4 test ./a/b.go x@y:1,2%+" {
		t.Errorf("plain words written as %q", s)
	}
	// Words the shell reads as syntax in the first place are names.
	for _, first := range []string{"if", "A=b", "!", "{", "while"} {
		script, _ := commandLine([]string{first})
		var stderr bytes.Buffer
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 127 {
			t.Errorf("%q as the command (script %q): %v %s, want 127 (not found)", first, script, err, stderr.String())
		}
	}
	if _, err := commandLine([]string{"echo", "a\x00b"}); err == nil || !strings.Contains(err.Error(), "argument 2 of CMD has a NUL byte") {
		t.Errorf("a NUL byte: %v", err)
	}
}
