package cli_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/cli"
)

// TestStoreMigrateFlags: store migrate copies from the data dir's
// jobs.db (or --from sqlite:PATH) to --to (or DELEGATE_STORE); a --to
// or --from of another kind is a usage error naming the flag; the
// copy's error is the command's.
func TestStoreMigrateFlags(t *testing.T) {
	const pg = "postgres://u:pw@db.example/delegate"
	for _, c := range []struct {
		name     string
		env      map[string]string
		args     []string
		fail     error
		code     int
		from, to string // what the copy was given
		says     string
	}{
		{"defaults", map[string]string{"DELEGATE_STORE": pg}, nil, nil, 0, "/data/jobs.db", pg, ""},
		{"flags", nil, []string{"--from", "sqlite:/old/dir", "--to", pg}, nil, 0, "/old/dir", pg, ""},
		{"no target", nil, nil, nil, 2, "", "", "--to: name the PostgreSQL database"},
		{"not postgres", nil, []string{"--to", "mysql://h/db"}, nil, 2, "", "", "--to: must be a PostgreSQL URL"},
		{"not sqlite", nil, []string{"--from", "/old/dir", "--to", pg}, nil, 2, "", "", "--from: must be sqlite:PATH"},
		{"refused", nil, []string{"--to", pg}, errors.New("the database is not empty"), 1, "/data/jobs.db", pg, "the database is not empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"DELEGATE_DATA_DIR": "/data"}
			for k, v := range c.env {
				env[k] = v
			}
			var stdout, stderr bytes.Buffer
			var from, to string
			code := cli.Execute(context.Background(), cli.Program{
				Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] },
				MigrateStore: func(ctx context.Context, path, url string, out io.Writer) error {
					from, to = path, url
					return c.fail
				},
			}, append([]string{"store", "migrate"}, c.args...))
			if code != c.code || from != c.from || to != c.to || !strings.Contains(stderr.String(), c.says) {
				t.Errorf("exit %d, copied %q to %q, stderr %q; want %d, %q to %q, %q", code, from, to, stderr.String(), c.code, c.from, c.to, c.says)
			}
		})
	}
}
