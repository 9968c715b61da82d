package deptest

// Rules are delegate's import rules (DESIGN.md, "The shape of the house").
// cmd/delegate wires everything and may import anything; tests may too.
func Rules() []Rule {
	adapters := []string{"mcpserver", "httpapi", "cli", "dashboard", "pvetools", "metrics"}
	return []Rule{
		{
			Why:      "the domain root (package delegate) imports nothing of ours: everything depends on it, it on nothing",
			Packages: []string{"."},
			Ours:     true,
		},
		{
			Why: "adapters (MCP tools, HTTP callbacks, the CLI, the dashboard, the Proxmox admin tools, the metrics) " +
				"use the root's service interfaces, never the engine, the store or a sandbox backend",
			Packages:  adapters,
			Forbidden: []string{"engine", "sqlite", "postgres", "local", "proxmox"},
			Except: []Exception{{
				Package: "cli", Via: "pvesim",
				Why: "`delegate pvesim` runs the Proxmox simulator in-process, and the simulator's guests are local sandboxes; " +
					"to lift it, wire the command in through cli.Program as Serve and Bench are",
			}},
		},
		{
			Why: "backends (the local sandbox, Proxmox, its API client, the simulator) know neither the engine nor the store " +
				"nor any adapter: the engine drives them through package sandbox",
			Packages:  []string{"local", "proxmox", "pve", "pvesim"},
			Forbidden: append([]string{"engine", "sqlite", "postgres"}, adapters...),
		},
		{
			Why: "the engine is written once for every backend and every store: it knows them through the sandbox " +
				"contract and the root's store interfaces, and knows no adapter",
			Packages:  []string{"engine"},
			Forbidden: append([]string{"sqlite", "postgres", "local", "proxmox", "pve", "pvesim"}, adapters...),
		},
		{
			Why:      "the store contract (storetest) is written against the root's store interfaces alone, so that every store can run it",
			Packages: []string{"storetest"},
			Ours:     true,
		},
		{
			Why: "internal/testkit serves the tests of the engine and the backends too, so it imports none of them " +
				"(an engine over the fake backend is testkit/testengine's, the simulator testkit/testsim's)",
			Packages:  []string{"internal/testkit"},
			Forbidden: append([]string{"engine", "sandbox", "sandboxtest", "local", "proxmox", "pve", "pvesim"}, adapters...),
		},
		{
			Why:       "the stores (sqlite, postgres) keep the root's types: they know no engine, backend or adapter",
			Packages:  []string{"sqlite", "postgres"},
			Forbidden: append([]string{"engine", "sandbox", "local", "proxmox", "pve", "pvesim", "storetest"}, adapters...),
		},
	}
}
