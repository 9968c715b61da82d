package proxmox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/delegate-dev/delegate/pve"
)

// Draining a node (delegate proxmox drain NODE): no new VM of any
// delegate server goes there, and what runs there goes on to its end.
// The mark is a line of the node's notes (Datacenter → node → Notes;
// PUT /nodes/{node}/config description), which every server reads
// (maintenance, in placement.go): it lives in the cluster, not in a
// server, and a person sees it where they look.

// DrainMarker is the line of a node's notes that drains it.
const DrainMarker = "delegate: drained (no new job VMs; delegate proxmox drain --undo NODE ends it)"

// isDrained: a node's notes hold DrainMarker.
func isDrained(notes string) bool {
	return slices.Contains(strings.Split(notes, "\n"), DrainMarker)
}

// DrainedVM is a VM of delegate's on a drained node.
type DrainedVM struct {
	VMID int
	Name string
	// Kind is "job", "kept sandbox" or "warm pool".
	Kind string
	// Owner is its job's or kept sandbox's id ("" for a pool VM).
	Owner string
}

// Drain marks a node drained (undo: no longer), and lists delegate's VMs
// still on it (of every instance): jobs run to their ends there, kept
// sandboxes live on until released or expired, unless migrated off; a
// warm pool's idle VMs there are retired by their pool. Marking needs
// Sys.Modify on /, reading the notes Sys.Audit on /.
func Drain(ctx context.Context, c *pve.Client, node string, undo bool) ([]DrainedVM, error) {
	if !nodeNameRe().MatchString(node) {
		return nil, fmt.Errorf("node %q: not a node name", node)
	}
	// A node not in the cluster: Proxmox answers a read of its notes
	// with a 500 of a failed hostname lookup, which hides the typo.
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list the nodes: %w", privilegeHint(err))
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Node)
	}
	slices.Sort(names)
	if !slices.Contains(names, node) {
		return nil, fmt.Errorf("node %q: not a node of this cluster (its nodes: %s)", node, strings.Join(names, ", "))
	}
	nc, err := c.NodeConfig(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("proxmox: read node %s's notes: %w", node, privilegeHint(err))
	}
	lines := slices.DeleteFunc(strings.Split(nc.Description, "\n"), func(l string) bool { return l == DrainMarker })
	if !undo {
		lines = append(lines, DrainMarker)
	}
	notes := strings.Trim(strings.Join(lines, "\n"), "\n")
	if notes != nc.Description {
		if err := c.SetNodeDescription(ctx, node, notes, nc.Digest); err != nil {
			return nil, fmt.Errorf("proxmox: write node %s's notes: %w", node, privilegeHint(err))
		}
	}
	if undo {
		return nil, nil
	}
	resources, err := c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", err)
	}
	var out []DrainedVM
	for _, r := range resources {
		if r.Node != node {
			continue
		}
		if _, ok := delegateInstance(r); !ok {
			continue
		}
		v := DrainedVM{VMID: int(r.VMID), Name: r.Name, Kind: "warm pool"}
		for _, t := range r.TagList() {
			switch {
			case strings.HasPrefix(t, "job-"):
				v.Kind, v.Owner = "job", t
			case strings.HasPrefix(t, "sbx-"):
				v.Kind, v.Owner = "kept sandbox", t
			}
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b DrainedVM) int { return a.VMID - b.VMID })
	return out, nil
}
