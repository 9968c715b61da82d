//go:build linux

package local

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

func TestExec(t *testing.T) {
	b := newBackend(t, 0)
	tests := []struct {
		name       string
		cmd        sandbox.Command
		wantCode   int
		wantSignal string
		wantOut    []string
		wantExact  string
	}{
		{
			name:     "exit code and both streams",
			cmd:      sandbox.Command{Args: []string{"/bin/sh", "-c", "echo hi; echo err >&2; exit 3"}},
			wantCode: 3, wantExact: "hi\nerr\n",
		},
		{
			name:     "death by signal",
			cmd:      sandbox.Command{Args: []string{"/bin/sh", "-c", "kill -TERM $$"}},
			wantCode: 128 + 15, wantSignal: "terminated",
		},
		{
			name:     "program looked up on the job's PATH",
			cmd:      sandbox.Command{Args: []string{"printenv"}, Env: []string{"PATH=/usr/bin", "ONLY=this"}},
			wantCode: 0, wantExact: "PATH=/usr/bin\nONLY=this\n",
		},
		{
			name:     "program not on the job's PATH",
			cmd:      sandbox.Command{Args: []string{"true"}, Env: []string{"PATH=/nonexistent"}},
			wantCode: codeNotFound, wantOut: []string{setupPrefix, `"true": command not found`},
		},
		{
			name:     "missing program by path",
			cmd:      sandbox.Command{Args: []string{"/usr/bin/no-such-program"}},
			wantCode: codeNotFound, wantOut: []string{setupPrefix, "no such file"},
		},
		{
			name:     "arguments are not interpreted by a shell",
			cmd:      sandbox.Command{Args: []string{"/bin/echo", "$HOME; `id` | x", "'q'"}},
			wantCode: 0, wantExact: "$HOME; `id` | x 'q'\n",
		},
		{
			name:     "working directory",
			cmd:      sandbox.Command{Args: []string{"/bin/pwd"}, Dir: "/tmp"},
			wantCode: 0, wantExact: "/tmp\n",
		},
		{
			name:     "default working directory is /workspace",
			cmd:      sandbox.Command{Args: []string{"/bin/pwd"}},
			wantCode: 0, wantExact: "/workspace\n",
		},
		{
			name:     "missing working directory",
			cmd:      sandbox.Command{Args: []string{"/bin/true"}, Dir: "/workspace/nope"},
			wantCode: codeCannotExec, wantOut: []string{setupPrefix, "/workspace/nope"},
		},
		{
			name:     "not executable",
			cmd:      sandbox.Command{Args: []string{"/etc/passwd"}},
			wantCode: codeCannotExec, wantOut: []string{setupPrefix, "permission denied"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := create(t, b, defaultSpec())
			tt.cmd.OutputLimit = 1 << 20
			p, err := sb.Exec(context.Background(), tt.cmd)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			exit, out := finish(t, p)
			if exit.Code != tt.wantCode || exit.Signal != tt.wantSignal {
				t.Errorf("exit = %+v, want code %d signal %q; output:\n%s", exit, tt.wantCode, tt.wantSignal, out)
			}
			if exit.Killed || exit.OOMKilled || exit.Truncated || exit.OutputBytes != int64(len(out)) {
				t.Errorf("exit = %+v, want not killed, not truncated, %d output bytes", exit, len(out))
			}
			if tt.wantExact != "" && out != tt.wantExact {
				t.Errorf("output = %q, want %q", out, tt.wantExact)
			}
			wantContains(t, out, tt.wantOut...)
		})
	}
}

func TestOutputLimitAndReadOutput(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	// 5000 lines of "0123456789" = 55000 bytes, of which 100 are kept.
	p, err := sb.Exec(context.Background(), sandbox.Command{
		Args:        []string{"/bin/sh", "-c", `i=0; while [ $i -lt 5000 ]; do echo 0123456789; i=$((i+1)); done`},
		OutputLimit: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	exit, out := finish(t, p)
	if exit.Code != 0 || exit.OutputBytes != 55000 || !exit.Truncated {
		t.Errorf("exit = %+v, want code 0, 55000 bytes, truncated", exit)
	}
	if want := strings.Repeat("0123456789\n", 10)[:100]; out != want {
		t.Errorf("kept output = %q, want the first 100 bytes %q", out, want)
	}
	for _, c := range []struct {
		offset int64
		max    int
		want   string
	}{
		{0, 5, "01234"},
		{95, 100, "789\n0"},
		{100, 10, ""},
		{1000, 10, ""},
		{11, 0, ""},
	} {
		outs, err := p.ReadOutput(context.Background(), c.offset, c.max)
		if got := sandbox.Join(outs); err != nil || string(got) != c.want {
			t.Errorf("ReadOutput(%d, %d) = %q, %v; want %q", c.offset, c.max, tagged(outs), err, c.want)
		}
	}
	if _, err := p.ReadOutput(context.Background(), -1, 10); err == nil {
		t.Error("ReadOutput with a negative offset succeeded")
	}
}

func TestExecOnceAndValidation(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	for _, cmd := range []sandbox.Command{
		{},
		{Args: []string{""}},
		{Args: []string{"/bin/true", "a\x00b"}},
		{Args: []string{"/bin/true"}, Env: []string{"NOEQUALS"}},
		{Args: []string{"/bin/true"}, Env: []string{"=x"}},
		{Args: []string{"/bin/true"}, Dir: "relative"},
	} {
		if _, err := sb.Exec(context.Background(), cmd); err == nil {
			t.Errorf("Exec(%+v) succeeded", cmd)
		}
	}
	exit, _ := run(t, sb, "/bin/true")
	if exit.Code != 0 {
		t.Fatalf("exit = %+v", exit)
	}
	if _, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/true"}}); err == nil || !strings.Contains(err.Error(), "one command") {
		t.Errorf("second Exec: err = %v, want a one-command error", err)
	}
}

// TestEnvNotKeptOnDisk: the job gets its environment (often secrets), but
// the sandbox directory does not keep it once the job has started.
func TestEnvNotKeptOnDisk(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/usr/bin/printenv", "TOKEN"}, Env: []string{"TOKEN=hunter2-secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if exit, out := finish(t, p); exit.Code != 0 || out != "hunter2-secret\n" {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	for _, f := range []string{fileExec, fileState, fileExit, fileShimLog} {
		data, _ := os.ReadFile(sb.path(f))
		if strings.Contains(string(data), "hunter2") {
			t.Errorf("%s keeps the environment: %s", f, data)
		}
	}
	// The process can still be found by its id.
	if _, err := sb.Process(context.Background(), p.ID()); err != nil {
		t.Errorf("Process after the scrub: %v", err)
	}
}
