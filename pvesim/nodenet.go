package pvesim

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
)

// Each node's network configuration (/etc/network/interfaces, as
// pve-manager PVE/API2/Network.pm reads it): its NIC eno1 and its bridge
// vmbr0 on it, which carries the node's own address (10.0.0.11, .12...)
// and its default gateway, as the installer makes them; and the bridges
// of Options.Bridges. GET /nodes/{node}/network/{iface} reads one (Sys.Audit
// on the node; "interface does not exist" for another name), and a VM
// whose NIC names a bridge the node lacks does not start ("bridge 'x'
// does not exist": qemu-server's tap_plug).

// BridgeSpec is a bridge every node has besides vmbr0.
type BridgeSpec struct {
	Name string // vmbrN
	// Ports are its ports ("eno2"; "" for a bridge with none: only its VMs
	// and the node are on it).
	Ports string
	// CIDR is the node's address on it ("10.9.0.11/24"), "" for none.
	CIDR    string
	Gateway string // the node's default gateway through it, if any
	// VLANAware: the bridge carries VLANs (a VM NIC's tag).
	VLANAware bool
	// VLANAddresses are the node's addresses on VLANs of the bridge, by
	// tag ("vmbr0.20" interfaces).
	VLANAddresses map[int]string
}

// nodeIfaces are a node's interfaces by name, as GET .../network/{iface}
// answers them. Call with s.mu held.
func (s *Server) nodeIfaces(node string) map[string]map[string]any {
	ip := s.nodeIP(node)
	out := map[string]map[string]any{
		"eno1": {"iface": "eno1", "type": "eth", "method": "manual", "families": []string{"inet"}, "active": 1, "autostart": 1, "exists": 1},
		"vmbr0": {"iface": "vmbr0", "type": "bridge", "method": "static", "families": []string{"inet"}, "active": 1, "autostart": 1,
			"address": ip, "netmask": "24", "cidr": ip + "/24", "gateway": "10.0.0.1", "bridge_ports": "eno1", "bridge_stp": "off", "bridge_fd": "0"},
	}
	for _, b := range s.opts.Bridges {
		e := map[string]any{"iface": b.Name, "type": "bridge", "method": "manual", "families": []string{"inet"}, "active": 1, "autostart": 1,
			"bridge_ports": b.Ports, "bridge_stp": "off", "bridge_fd": "0"}
		if p, err := netip.ParsePrefix(b.CIDR); err == nil {
			e["method"], e["cidr"], e["address"], e["netmask"] = "static", b.CIDR, p.Addr().String(), fmt.Sprint(p.Bits())
		}
		if b.Gateway != "" {
			e["gateway"] = b.Gateway
		}
		if b.VLANAware {
			e["bridge_vlan_aware"] = 1
		}
		out[b.Name] = e
		for tag, cidr := range b.VLANAddresses {
			name := fmt.Sprintf("%s.%d", b.Name, tag)
			v := map[string]any{"iface": name, "type": "vlan", "method": "static", "families": []string{"inet"}, "active": 1, "autostart": 1,
				"vlan-raw-device": b.Name, "vlan-id": tag, "cidr": cidr}
			if p, err := netip.ParsePrefix(cidr); err == nil {
				v["address"], v["netmask"] = p.Addr().String(), fmt.Sprint(p.Bits())
			}
			out[name] = v
		}
	}
	return out
}

// hasBridge: the node has a bridge of that name. Call with s.mu held.
func (s *Server) hasBridge(node, name string) bool {
	e := s.nodeIfaces(node)[name]
	return e != nil && (e["type"] == "bridge" || e["type"] == "OVSBridge")
}

// GET /nodes/{node}/network/{iface}
func hNodeIface(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.nodeIfaces(c.str("node"))[c.str("iface")]
	if e == nil {
		return nil, paramErr("iface", "interface does not exist")
	}
	out := maps.Clone(e)
	delete(out, "iface")
	if strings.HasPrefix(c.str("iface"), "vmbr") && out["bridge_ports"] == "" {
		out["bridge_ports"] = "none"
	}
	return out, nil
}
