//go:build linux

package local

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestInputs: a command's inputs are files only the job's user reads, on
// a read-only mount at $DELEGATE_INPUTS (set over what Env says), one of
// them its standard input; their text is in no process's argument list
// on the host.
func TestInputs(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			marker := "input-marker-" + mode + "-" + strings.Repeat("x", 8)
			script := `echo "$DELEGATE_INPUTS"; cd "$DELEGATE_INPUTS"; ls -ln | sed 1d | while read -r m l u g s rest; do echo "$m $u $g $s"; done
				stat -c '%a %u' .; { echo "` + marker + `" > script; } 2>/dev/null || echo "not writable"
				touch new 2>/dev/null || echo "no new file"; od -An -c; sleep 1000`
			data := []byte("a\x00b\xff\n")
			sb := create(t, b, defaultSpec())
			p, err := sb.Exec(context.Background(), sandbox.Command{
				Args:   []string{"/bin/sh", "-c", `exec /bin/sh "$DELEGATE_INPUTS/script"`},
				Env:    append([]string{InputsEnv + "=/elsewhere"}, testEnv...),
				Inputs: map[string][]byte{"script": []byte(script), "data": data, "empty": nil},
				Stdin:  "data", OutputLimit: 1 << 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			// While it runs, no argument list on the host holds the
			// script: look at every process's.
			if !waitFor(20*time.Second, func() bool {
				out, _ := p.ReadOutput(context.Background(), 0, 1<<20)
				return strings.Contains(string(sandbox.Join(out)), "\\n")
			}) {
				out, _ := p.ReadOutput(context.Background(), 0, 1<<20)
				t.Fatalf("the job did not get as far as reading its stdin: %q", sandbox.Join(out))
			}
			procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			seen := false // the job's shell, as the control that the look sees it
			for _, f := range procs {
				cl, err := os.ReadFile(f)
				if err != nil {
					continue
				}
				if bytes.Contains(cl, []byte(marker)) {
					t.Errorf("%s holds the script: %q", f, cl)
				}
				seen = seen || bytes.Equal(cl, []byte("/bin/sh\x00"+InputsDir+"/script\x00"))
			}
			if !seen {
				t.Error("no process on the host runs the job's script: the look at argument lists sees nothing")
			}
			if err := p.Kill(context.Background()); err != nil {
				t.Fatal(err)
			}
			_, out := finish(t, p)
			want := InputsDir + "\n" +
				"-r-------- 1000 1000 5\n-r-------- 1000 1000 0\n-r-------- 1000 1000 " + strconv.Itoa(len(script)) + "\n" +
				"500 1000\nnot writable\nno new file\n" +
				"   a  \\0   b 377  \\n\n"
			if out != want {
				t.Errorf("output %q\nwant   %q", out, want)
			}
		})
	}
}

// TestInputsRefused: a name that is not one file name, too many inputs,
// or a Stdin that names no input is refused before anything runs.
func TestInputsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inputs map[string][]byte
		stdin  string
		want   string
	}{
		{"a path", map[string][]byte{"a/b": nil}, "", `input "a/b": a name is`},
		{"dot dot", map[string][]byte{"..": nil}, "", `input "..": a name is`},
		{"hidden", map[string][]byte{".x": nil}, "", `input ".x": a name is`},
		{"empty name", map[string][]byte{"": nil}, "", `input "": a name is`},
		{"stdin unknown", map[string][]byte{"a": nil}, "b", `Stdin "b" names no input`},
		{"stdin without inputs", nil, "a", `Stdin "a" names no input`},
		{"too large", map[string][]byte{"a": make([]byte, maxInputBytes+1)}, "", "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validateCommand(sandbox.Command{Args: []string{"x"}, Inputs: tc.inputs, Stdin: tc.stdin})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := validateCommand(sandbox.Command{Args: []string{"x"}, Inputs: map[string][]byte{"script": nil, "a.b-c_1": nil}, Stdin: "script"}); err != nil {
		t.Errorf("good inputs refused: %v", err)
	}
}

// TestNoHostPathsInside: nothing a job can read names where its sandbox
// is on the host (the data dir): not its mount table, with or without
// network or a template, with either helper. (A template's own binds
// show its path under the rootfs directory: the kernel shows a bind's
// source as a path on its filesystem.)
func TestNoHostPathsInside(t *testing.T) {
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			b := newBackend(t, 0)
			b.shims.goHelpers = mode == "Go"
			tpl := defaultSpec()
			tpl.Template = useRootfs(b, buildRootfs(t))
			specs := []sandbox.Spec{defaultSpec(), tpl}
			if mode == "Go" {
				if _, err := findNetTool("", b.nets.lookPath); err == nil {
					specs = append(specs, networkSpec())
				}
			}
			for _, spec := range specs {
				sb := create(t, b, spec)
				// dash builtins only: a template has nothing else.
				exit, out := run(t, sb, "/bin/sh", "-c", `for f in /proc/self/mountinfo /proc/self/mounts /proc/1/mountinfo; do while read -r l; do echo "$l"; done < $f; done
					[ -p /run/delegate/status ] && echo "status channel"`)
				if exit.Code != 0 || !strings.Contains(out, "status channel") {
					t.Fatalf("exit %+v:\n%s", exit, out)
				}
				for _, leak := range []string{b.dir, sb.id} {
					if strings.Contains(out, leak) {
						t.Errorf("network %v, template %q: the job reads %q:\n%s", spec.Network, spec.Template, leak, out)
					}
				}
			}
		})
	}
}
