package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
)

// proxmoxGC is `delegate proxmox gc` (proxmox/gc.go).
func proxmoxGC(ctx context.Context, getenv func(string) string, opts cli.ProxmoxGCOptions, out io.Writer, log *slog.Logger) error {
	pc, err := pve.ConfigFromEnv(getenv)
	if err != nil {
		return err
	}
	pc.Logger = log
	client, err := pve.New(pc)
	if err != nil {
		return err
	}
	defer client.Close()
	items, err := proxmox.GC(ctx, client, proxmox.GCOptions{OlderThan: opts.OlderThan, Unstamped: opts.Unstamped, Act: opts.Act, Logger: log})
	for _, it := range items {
		fmt.Fprintln(out, it)
	}
	switch {
	case err != nil:
		return err
	case len(items) == 0:
		fmt.Fprintf(out, "no VM of a delegate server unseen for %s\n", opts.OlderThan)
	case !opts.Act:
		fmt.Fprintf(out, "%d VMs; nothing removed (--act removes them)\n", len(items))
	}
	return nil
}
