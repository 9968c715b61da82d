package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// loadStore reads DELEGATE_STORE: empty for the SQLite store in the data
// dir (the default), or a PostgreSQL URL. Its value is not repeated in
// an error: it may hold a password.
func (c *Config) loadStore(getenv func(string) string, errs *[]string) {
	v := getenv("DELEGATE_STORE")
	if v == "" {
		return
	}
	if !IsPostgresURL(v) {
		*errs = append(*errs, "DELEGATE_STORE: must be empty (SQLite in the data dir) or a PostgreSQL URL like "+
			"postgres://user:password@host:5432/database (the value set is neither; it is not shown, as it may hold a password)")
		return
	}
	c.Store = v
}

// IsPostgresURL says whether s names a PostgreSQL database.
func IsPostgresURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql")
}

func (p *Program) storeCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Move the store (the jobs and all they keep) to PostgreSQL",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var from, to string
	migrate := &cobra.Command{
		Use:   "migrate --to postgres://… [--from sqlite:PATH]",
		Short: "Copy a data dir's SQLite store into an empty PostgreSQL database",
		Long: `Copy everything a data dir's SQLite store keeps (jobs with their manifests,
output, timelines, artifacts' records, questions and workspaces; kept
sandboxes; networks and their logs) into an empty PostgreSQL database, in one
transaction. A database that holds anything already is refused. Stop the
server first; afterwards, start it with DELEGATE_STORE set to the same URL.
Artifact files stay in the data dir (artifacts/), where the server reads them.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				to = cfg.Store
			}
			if to == "" {
				return usagef("--to: name the PostgreSQL database to copy into (postgres://user:password@host:5432/database), or set DELEGATE_STORE")
			}
			if !IsPostgresURL(to) {
				return usagef("--to: must be a PostgreSQL URL like postgres://user:password@host:5432/database")
			}
			if from == "" {
				from = "sqlite:" + filepath.Join(cfg.DataDir, "jobs.db")
			}
			path, ok := strings.CutPrefix(from, "sqlite:")
			if !ok || path == "" {
				return usagef("--from: must be sqlite:PATH, PATH a data dir or its jobs.db (got %q)", from)
			}
			if p.MigrateStore == nil {
				return fmt.Errorf("this delegate cannot move a store")
			}
			return p.MigrateStore(cmd.Context(), path, to, cmd.OutOrStdout())
		},
	}
	migrate.Flags().StringVar(&from, "from", "", "the SQLite store: sqlite:PATH, a data dir or its jobs.db (default: DELEGATE_DATA_DIR's)")
	migrate.Flags().StringVar(&to, "to", "", "the PostgreSQL database, empty (default: DELEGATE_STORE)")
	cmd.AddCommand(migrate)
	return cmd
}

// MigrateStoreFunc copies the SQLite store at path (a data dir or its
// jobs.db) into the empty PostgreSQL database at url, printing what it
// copied on out.
type MigrateStoreFunc func(ctx context.Context, path, url string, out io.Writer) error
