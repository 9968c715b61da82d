package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/metrics"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/sqlite"
)

// store is what the app needs of the store: the store, its counts for
// the metrics, and Close.
type store interface {
	delegate.Store
	metrics.JobCounter
	Close() error
}

// openStore opens the store DELEGATE_STORE names: the SQLite store in
// the data dir (the default), or a PostgreSQL database.
func openStore(ctx context.Context, cfg cli.Config) (store, error) {
	if cfg.Store != "" {
		db, err := postgres.Open(ctx, cfg.Store)
		if err != nil {
			return nil, fmt.Errorf("store (DELEGATE_STORE): %w", err)
		}
		return db, nil
	}
	db, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "jobs.db"))
	if err != nil {
		return nil, err
	}
	return db, nil
}

// storeName says which store the server keeps its jobs in, for its log
// (a URL without its password).
func storeName(cfg cli.Config) string {
	if cfg.Store != "" {
		return postgres.Redact(cfg.Store)
	}
	return "sqlite:" + filepath.Join(cfg.DataDir, "jobs.db")
}

// migrateStore is `delegate store migrate`: the SQLite store at path
// copied into the empty PostgreSQL database at url.
func migrateStore(ctx context.Context, path, url string, out io.Writer) error {
	path, err := postgres.SQLitePath("sqlite:" + path)
	if err != nil {
		return err
	}
	db, err := postgres.Open(ctx, url)
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := db.CopyFromSQLite(ctx, path)
	if err != nil {
		return fmt.Errorf("copy %s: %w", path, err)
	}
	fmt.Fprintf(out, "Copied %s into %s:\n", path, db)
	fmt.Fprintf(out, "  %d jobs (%s of output, %d workspaces), %d questions\n", c.Jobs, delegate.FormatBytes(c.OutputBytes), c.Workspaces, c.Questions)
	fmt.Fprintf(out, "  %d kept sandboxes, %d networks\n", c.Sandboxes, c.Networks)
	fmt.Fprintf(out, "Start the server with DELEGATE_STORE set to that URL (the artifact files stay in the data dir's artifacts/).\n")
	return nil
}

// instanceID is the Proxmox instance id the server names its VMs with:
// its data dir's, or, where servers share a PostgreSQL store, the
// store's (the first server's data dir's), so that any of them
// re-attaches the VMs of another.
func instanceID(ctx context.Context, cfg cli.Config, st store) (string, error) {
	own, err := proxmox.StableInstanceID(cfg.DataDir)
	if err != nil {
		return "", err
	}
	cluster, ok := st.(interface {
		ClusterValue(ctx context.Context, name string, fresh func() string) (string, error)
	})
	if !ok || st == nil {
		return own, nil
	}
	return cluster.ClusterValue(ctx, "proxmox-instance", func() string { return own })
}
