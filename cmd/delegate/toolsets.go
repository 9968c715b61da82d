package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvetools"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/errgroup"
)

// newMCPServer builds the MCP server with the toolsets cfg names: the job
// tools (jobs), the Proxmox admin tools (proxmox), or both. With proxmox
// alone it is a Proxmox MCP server, which still reads the job store to
// leave the VMs of running jobs alone.
//
// What it keeps running until ctx ends runs in g.
func newMCPServer(ctx context.Context, g *errgroup.Group, cfg cli.Config, eng *engine.Engine, log *slog.Logger) (*mcp.Server, error) {
	var s *mcp.Server
	if cfg.HasToolset("jobs") {
		svc := mcpserver.Services{Jobs: eng, Sandboxes: eng, Questions: eng, Network: eng, Workspaces: eng}
		if cfg.HasToolset("checkpoints") {
			svc.Checkpoints = eng
		}
		js := mcpserver.New(svc, log)
		g.Go(func() error { return js.PublishUpdates(ctx) })
		s = js.Server
	} else {
		s = mcp.NewServer(&mcp.Implementation{Name: "delegate", Title: "delegate: Proxmox VE administration", Version: buildinfo.Version()},
			&mcp.ServerOptions{Instructions: "Proxmox VE tools: nodes, VMs and containers, snapshots, tasks, storage, guest agent.",
				Logger: log})
	}
	if cfg.HasToolset("proxmox") {
		client, err := pve.New(cfg.Proxmox)
		if err != nil {
			return nil, fmt.Errorf("proxmox toolset: %w", err)
		}
		g.Go(func() error {
			<-ctx.Done()
			client.Close()
			return nil
		})
		check, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = client.Version(check)
		cancel()
		if err != nil {
			// The tools answer with the error when called; a cluster that is
			// down now should not keep the server from starting.
			log.Warn("proxmox toolset: the API does not answer yet", "host", cfg.Proxmox.Host, "err", err)
		}
		if err := pvetools.Register(s, pvetools.Config{Client: client, AllowElevated: cfg.ProxmoxAllowElevated, Jobs: eng,
			Logger: log.With("toolset", "proxmox")}); err != nil {
			return nil, err
		}
		log.Info("proxmox toolset", "host", cfg.Proxmox.Host, "elevated", cfg.ProxmoxAllowElevated)
	}
	return s, nil
}
