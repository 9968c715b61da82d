package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestHandOffRefusal: a server runs a handed command only where it
// would run as in the process that sent it; otherwise Execute returns
// ExitDeclined having read nothing, written nothing and opened nothing.
func TestHandOffRefusal(t *testing.T) {
	env := map[string]string{"DELEGATE_DATA_DIR": "/srv/dd", "HOME": "/home/u"}
	getenv := func(k string) string { return env[k] }
	server, err := LoadConfig(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := server.check(); err != nil {
		t.Fatal(err)
	}
	server.Toolsets = []string{"jobs", "proxmox"} // serve's own: no matter
	server.MaxConcurrent = 9
	tests := []struct {
		args    []string
		env     map[string]string
		dir     string
		decline string // a word of the reason; "" to run
	}{
		{args: []string{"run", "--script", "true"}},
		{args: []string{"exec", "sbx-abc", "--", "true"}},
		{args: []string{"run", "--file", "/etc/hostname", "--script", "true"}},
		{args: []string{"--data-dir", "dd", "run", "--script", "true"}, dir: "/srv"},
		{args: []string{"run", "--env", "A=1", "--agent", "script", "--script", "true"}, env: map[string]string{"DELEGATE_LOG_LEVEL": "debug"}},
		{args: []string{"run", "--secret", "KEY", "--script", "true"}, decline: "--secret"},
		{args: []string{"run", "--manifest", "job.json"}, decline: "--manifest"},
		{args: []string{"run", "--workspace", "/src", "--script", "true"}, decline: "--workspace"},
		{args: []string{"run", "--max-concurrent", "2", "--script", "true"}, decline: "--max-concurrent"},
		{args: []string{"run", "--agent", "claude", "--task", "x"}, decline: "--agent"},
		{args: []string{"run", "--file", "src", "--script", "true"}, decline: "relative"},
		{args: []string{"run", "--file", "./a:b", "--script", "true"}, decline: "relative"},
		{args: []string{"--data-dir", "/other", "run", "--script", "true"}, decline: "settings"},
		{args: []string{"run", "--script", "true"}, env: map[string]string{"DEFAULT_MEMORY": "1G"}, decline: "settings"},
		{args: []string{"run", "--script", "true"}, env: map[string]string{"DEFAULT_MEMORY": "lots"}, decline: "settings"},
		{args: []string{"jobs", "list"}, decline: "only run and exec"},
		{args: []string{"serve"}, decline: "only run and exec"},
		{args: []string{"nonsense"}, decline: "only run and exec"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdin countingReader
			var stdout, stderr bytes.Buffer
			opened := false
			h := &HandOff{Server: server}
			p := Program{
				Stdin: &stdin, Stdout: &stdout, Stderr: &stderr,
				Getenv: func(k string) string {
					if v, ok := tt.env[k]; ok {
						return v
					}
					return env[k]
				},
				Dir: tt.dir, HandOff: h,
				Open: func(context.Context, Config, *slog.Logger, bool) (Services, func() error, error) {
					opened = true
					return Services{}, nil, delegate.ErrNotFound
				},
			}
			code := Execute(context.Background(), p, tt.args)
			if tt.decline == "" {
				if code == ExitDeclined || !opened {
					t.Fatalf("declined (%q) or not run (opened %v); want it run", h.Declined, opened)
				}
				return
			}
			if code != ExitDeclined || !strings.Contains(h.Declined, tt.decline) {
				t.Fatalf("exit %d, declined %q; want ExitDeclined for %q", code, h.Declined, tt.decline)
			}
			if opened || stdin.n > 0 || stdout.Len() > 0 || stderr.Len() > 0 {
				t.Errorf("declined after it opened the services (%v), read stdin (%d) or wrote %q %q", opened, stdin.n, stdout.String(), stderr.String())
			}
		})
	}
}

// countingReader counts the reads of standard input.
type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	r.n++
	return 0, io.EOF
}
