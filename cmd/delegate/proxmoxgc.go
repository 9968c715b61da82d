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

// proxmoxClient is a client of the cluster the PROXMOX_* settings name.
func proxmoxClient(getenv func(string) string, log *slog.Logger) (*pve.Client, error) {
	pc, err := pve.ConfigFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	pc.Logger = log
	return pve.New(pc)
}

// proxmoxDrain is `delegate proxmox drain` (proxmox/drain.go).
func proxmoxDrain(ctx context.Context, getenv func(string) string, node string, undo bool, out io.Writer, log *slog.Logger) error {
	client, err := proxmoxClient(getenv, log)
	if err != nil {
		return err
	}
	defer client.Close()
	vms, err := proxmox.Drain(ctx, client, node, undo)
	if err != nil {
		return err
	}
	if undo {
		fmt.Fprintf(out, "node %s takes VMs again\n", node)
		return nil
	}
	fmt.Fprintf(out, "node %s drained: no new VM of delegate's goes there\n", node)
	if len(vms) == 0 {
		fmt.Fprintln(out, "none of delegate's VMs is on it")
	}
	for _, v := range vms {
		fmt.Fprintf(out, "still on it: VM %d (%s) %s %s\n", v.VMID, v.Name, v.Kind, v.Owner)
	}
	return nil
}

// proxmoxGC is `delegate proxmox gc` (proxmox/gc.go).
func proxmoxGC(ctx context.Context, getenv func(string) string, opts cli.ProxmoxGCOptions, out io.Writer, log *slog.Logger) error {
	client, err := proxmoxClient(getenv, log)
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
