package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvetools"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// newMCPServer builds the MCP server with the toolsets cfg names: the job
// tools (jobs), the Proxmox admin tools (proxmox), or both. With proxmox
// alone it is a Proxmox MCP server, which still reads the job store to
// leave the VMs of running jobs alone.
func newMCPServer(ctx context.Context, cfg cli.Config, jobs delegate.JobService, log *slog.Logger) (*mcp.Server, error) {
	var s *mcp.Server
	if cfg.HasToolset("jobs") {
		s = mcpserver.New(ctx, jobs, log)
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
		go func() {
			<-ctx.Done()
			client.Close()
		}()
		check, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = client.Version(check)
		cancel()
		if err != nil {
			// The tools answer with the error when called; a cluster that is
			// down now should not keep the server from starting.
			log.Warn("proxmox toolset: the API does not answer yet", "host", cfg.Proxmox.Host, "err", err)
		}
		if err := pvetools.Register(s, pvetools.Config{Client: client, AllowElevated: cfg.ProxmoxAllowElevated, Jobs: jobs,
			Logger: log.With("toolset", "proxmox")}); err != nil {
			return nil, err
		}
		log.Info("proxmox toolset", "host", cfg.Proxmox.Host, "elevated", cfg.ProxmoxAllowElevated)
	}
	return s, nil
}
