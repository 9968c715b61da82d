package pve

import (
	"context"
	"strconv"
	"strings"
)

// Version is GET /version.
type Version struct {
	Version string `json:"version"` // e.g. 9.1.1
	Release string `json:"release"` // e.g. 9.1
	RepoID  string `json:"repoid"`
}

// Version returns the API server's version.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	_, err := c.get(ctx, "/version", nil, &v)
	return v, err
}

// Node is one entry of GET /nodes.
type Node struct {
	Node           string `json:"node"`
	Status         string `json:"status"` // online, offline, unknown
	CPU            Number `json:"cpu"`    // load, 0..1
	MaxCPU         Int    `json:"maxcpu"`
	Mem            Int    `json:"mem"`
	MaxMem         Int    `json:"maxmem"`
	Uptime         Int    `json:"uptime"`
	SSLFingerprint string `json:"ssl_fingerprint"`
}

// Nodes lists the cluster's nodes.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out []Node
	_, err := c.get(ctx, "/nodes", nil, &out)
	return out, err
}

// Resource types for ClusterResources.
const (
	ResourceAll     = ""
	ResourceVM      = "vm"
	ResourceNode    = "node"
	ResourceStorage = "storage"
)

// Resource is one entry of GET /cluster/resources.
type Resource struct {
	ID       string `json:"id"`   // qemu/100, node/pve1, storage/pve1/local-lvm
	Type     string `json:"type"` // qemu, lxc, node, storage, sdn, ...
	Node     string `json:"node"`
	VMID     Int    `json:"vmid"`
	Name     string `json:"name"`
	Status   string `json:"status"` // running, stopped, unknown; online, offline; available
	Template Bool   `json:"template"`
	Lock     string `json:"lock"`
	Tags     string `json:"tags"`
	Pool     string `json:"pool"`
	HAState  string `json:"hastate"`
	CPU      Number `json:"cpu"`
	MaxCPU   Number `json:"maxcpu"`
	Mem      Int    `json:"mem"`
	MaxMem   Int    `json:"maxmem"`
	Disk     Int    `json:"disk"`
	MaxDisk  Int    `json:"maxdisk"`
	Uptime   Int    `json:"uptime"`
	Storage  string `json:"storage"`
	// Shared (storage): the storage is reachable from every node.
	Shared     Bool   `json:"shared"`
	PluginType string `json:"plugintype"` // storage: dir, lvmthin, zfspool, rbd...
	Content    string `json:"content"`    // storage: images,rootdir,...
}

// TagList splits Tags ("a;b").
func (r Resource) TagList() []string { return splitTags(r.Tags) }

func splitTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

// ClusterResources lists the cluster's resources, all or of one type
// (ResourceVM, ResourceNode, ResourceStorage).
func (c *Client) ClusterResources(ctx context.Context, typ string) ([]Resource, error) {
	p := params{}
	if typ != "" {
		p["type"] = typ
	}
	var out []Resource
	_, err := c.get(ctx, "/cluster/resources", p, &out)
	return out, err
}

// NextID returns a free vmid (Proxmox answers it as a string). It is
// only free at the time of asking: a clone with it may still collide.
func (c *Client) NextID(ctx context.Context) (int, error) {
	var id Int
	if _, err := c.get(ctx, "/cluster/nextid", nil, &id); err != nil {
		return 0, err
	}
	return int(id), nil
}

// VMIDFree asks whether vmid is free (at the time of asking).
func (c *Client) VMIDFree(ctx context.Context, vmid int) (bool, error) {
	_, err := c.get(ctx, "/cluster/nextid", params{"vmid": strconv.Itoa(vmid)}, nil)
	if IsAlreadyExists(err) {
		return false, nil
	}
	return err == nil, err
}

// HAStatus is the HA manager's view of the cluster.
type HAStatus struct {
	// NodeStatus is each node's state: online, maintenance, unknown,
	// fence, gone.
	NodeStatus map[string]string
}

// HAManagerStatus reads the HA manager's status (Sys.Audit on /): a
// cluster without HA has no node states.
func (c *Client) HAManagerStatus(ctx context.Context) (HAStatus, error) {
	var res struct {
		ManagerStatus struct {
			NodeStatus map[string]string `json:"node_status"`
		} `json:"manager_status"`
	}
	_, err := c.get(ctx, "/cluster/ha/status/manager_status", nil, &res)
	return HAStatus{NodeStatus: res.ManagerStatus.NodeStatus}, err
}

// Permissions returns the privileges the caller (this token) has on a
// path: every user may ask for its own, so that a client can tell what
// it may do before it asks (and is refused).
func (c *Client) Permissions(ctx context.Context, path string) (map[string]bool, error) {
	var res map[string]map[string]Int
	if _, err := c.get(ctx, "/access/permissions", params{"path": path}, &res); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for p, v := range res[path] {
		out[p] = v == 1
	}
	return out, nil
}

// NodeConfig is what delegate reads of a node's config.
type NodeConfig struct {
	// Description is the node's notes.
	Description string `json:"description"`
	Digest      string `json:"digest"`
}

// NodeConfig reads a node's config (Sys.Audit on /).
func (c *Client) NodeConfig(ctx context.Context, node string) (NodeConfig, error) {
	var nc NodeConfig
	_, err := c.get(ctx, nodePath(node)+"/config", nil, &nc)
	return nc, err
}

// SetNodeDescription writes a node's notes (Sys.Modify on /), checked
// against the config's digest when one is given.
func (c *Client) SetNodeDescription(ctx context.Context, node, description, digest string) error {
	p := params{"description": description}
	if description == "" {
		p = params{"delete": "description"}
	}
	if digest != "" {
		p["digest"] = digest
	}
	return c.put(ctx, nodePath(node)+"/config", p, nil)
}
