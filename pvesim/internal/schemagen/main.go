// Command schemagen extracts from the official Proxmox VE API schema
// (pve-docs api-viewer/apidata.js, or a JSON conversion of it) the subset
// of methods pvesim serves, keeping only what validation needs, plus the
// list of every method of the full API (so the simulator can tell a route
// it does not simulate from one that does not exist).
//
//	go run ./internal/schemagen -in apidata.js -out schema/pve-api-subset.json -pve 9.x
//
// The output is AGPL-3.0 data, like its source: see schema/NOTICE.md.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Methods is what the simulator serves: "METHOD path".
var Methods = []string{
	"GET /version",
	"GET /nodes",
	"GET /cluster/resources",
	"GET /cluster/nextid",
	"POST /nodes/{node}/qemu/{vmid}/clone",
	"GET /nodes/{node}/qemu/{vmid}/config",
	"POST /nodes/{node}/qemu/{vmid}/config",
	"PUT /nodes/{node}/qemu/{vmid}/config",
	"GET /nodes/{node}/qemu/{vmid}/status/current",
	"POST /nodes/{node}/qemu/{vmid}/status/start",
	"POST /nodes/{node}/qemu/{vmid}/status/stop",
	"POST /nodes/{node}/qemu/{vmid}/status/shutdown",
	"POST /nodes/{node}/qemu/{vmid}/status/suspend",
	"POST /nodes/{node}/qemu/{vmid}/status/resume",
	"DELETE /nodes/{node}/qemu/{vmid}",
	"PUT /nodes/{node}/qemu/{vmid}/resize",
	"GET /nodes/{node}/tasks/{upid}/status",
	"GET /nodes/{node}/tasks/{upid}/log",
	"POST /nodes/{node}/qemu/{vmid}/agent/ping",
	"POST /nodes/{node}/qemu/{vmid}/agent/exec",
	"GET /nodes/{node}/qemu/{vmid}/agent/exec-status",
	"POST /nodes/{node}/qemu/{vmid}/agent/file-write",
	"GET /nodes/{node}/qemu/{vmid}/agent/file-read",
	"GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
	"GET /nodes/{node}/qemu/{vmid}/agent/info",
	"GET /nodes/{node}/qemu/{vmid}/pending",
	"GET /storage",
	"GET /nodes/{node}/storage",
	"GET /access/roles",
	"POST /access/roles",
	"GET /access/roles/{roleid}",
	"PUT /access/roles/{roleid}",
	"DELETE /access/roles/{roleid}",
	"GET /access/users",
	"POST /access/users",
	"GET /access/users/{userid}",
	"DELETE /access/users/{userid}",
	"GET /access/users/{userid}/token",
	"GET /access/users/{userid}/token/{tokenid}",
	"POST /access/users/{userid}/token/{tokenid}",
	"DELETE /access/users/{userid}/token/{tokenid}",
	"GET /access/acl",
	"PUT /access/acl",
	"GET /access/permissions",
	"GET /nodes/{node}/qemu",
	"POST /nodes/{node}/qemu/{vmid}/status/reboot",
	"POST /nodes/{node}/qemu/{vmid}/migrate",
	"POST /nodes/{node}/migrateall",
	"GET /nodes/{node}/qemu/{vmid}/snapshot",
	"POST /nodes/{node}/qemu/{vmid}/snapshot",
	"DELETE /nodes/{node}/qemu/{vmid}/snapshot/{snapname}",
	"POST /nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback",
	"GET /nodes/{node}/lxc",
	"GET /nodes/{node}/lxc/{vmid}/config",
	"GET /nodes/{node}/lxc/{vmid}/status/current",
	"POST /nodes/{node}/lxc/{vmid}/status/start",
	"POST /nodes/{node}/lxc/{vmid}/status/stop",
	"POST /nodes/{node}/lxc/{vmid}/status/shutdown",
	"POST /nodes/{node}/lxc/{vmid}/status/reboot",
	"DELETE /nodes/{node}/lxc/{vmid}",
	"GET /nodes/{node}/tasks",
	"GET /nodes/{node}/storage/{storage}/content",
	"GET /cluster/status",
	"GET /cluster/firewall/options",
	"GET /cluster/ha/status/manager_status",
	"GET /nodes/{node}/config",
	"PUT /nodes/{node}/config",
	"GET /cluster/firewall/groups",
	"POST /cluster/firewall/groups",
	"GET /cluster/firewall/groups/{group}",
	"POST /cluster/firewall/groups/{group}",
	"PUT /cluster/firewall/options",
	"GET /nodes/{node}/firewall/options",
	"GET /nodes/{node}/network/{iface}",
	"PUT /nodes/{node}/firewall/options",
	"GET /nodes/{node}/qemu/{vmid}/firewall/options",
	"PUT /nodes/{node}/qemu/{vmid}/firewall/options",
	"GET /nodes/{node}/qemu/{vmid}/firewall/rules",
	"POST /nodes/{node}/qemu/{vmid}/firewall/rules",
	"GET /nodes/{node}/qemu/{vmid}/firewall/ipset",
	"POST /nodes/{node}/qemu/{vmid}/firewall/ipset",
	"GET /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
	"POST /nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
}

// keep lists the schema keys validation and permission checks use; the
// rest (descriptions, type texts, renderers) is documentation.
var keep = map[string]bool{
	"type": true, "optional": true, "enum": true, "minimum": true, "maximum": true,
	"minLength": true, "maxLength": true, "pattern": true, "format": true,
	"default": true, "default_key": true, "alias": true, "keyAlias": true,
	"items": true, "properties": true, "additionalProperties": true, "requires": true,
}

type node struct {
	Path     string                     `json:"path"`
	Info     map[string]json.RawMessage `json:"info"`
	Children []node                     `json:"children"`
}

type method struct {
	Method      string         `json:"method"`
	Path        string         `json:"path"`
	AllowToken  int            `json:"allowtoken"`
	Protected   int            `json:"protected,omitempty"`
	ProxyTo     string         `json:"proxyto,omitempty"`
	Permissions any            `json:"permissions,omitempty"`
	Parameters  map[string]any `json:"parameters"`
	Returns     map[string]any `json:"returns"`
}

type output struct {
	Licence    string   `json:"licence"`
	Source     string   `json:"source"`
	SourceSHA  string   `json:"source_sha256"`
	PVE        string   `json:"pve"`
	Methods    []method `json:"methods"`
	AllMethods []string `json:"all_methods"`
}

func main() {
	in := flag.String("in", "", "apidata.js from pve-docs, or its JSON conversion")
	out := flag.String("out", "schema/pve-api-subset.json", "output file")
	pve := flag.String("pve", "9.x", "PVE version the input describes")
	flag.Parse()
	if err := run(*in, *out, *pve); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

func run(in, out, pve string) error {
	if in == "" {
		return errors.New("-in is required")
	}
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	raw = cutJS(raw)
	var tree []node
	if err := json.Unmarshal(raw, &tree); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	want := map[string]bool{}
	for _, m := range Methods {
		want[m] = true
	}
	res := output{
		Licence:   "AGPL-3.0-or-later, Proxmox Server Solutions GmbH; see NOTICE.md",
		Source:    "proxmox/pve-docs api-viewer/apidata.js (" + filepath.Base(in) + ")",
		SourceSHA: hex.EncodeToString(sum[:]),
		PVE:       pve,
	}
	var walk func([]node) error
	walk = func(nodes []node) error {
		for _, n := range nodes {
			for verb, info := range n.Info {
				key := verb + " " + n.Path
				res.AllMethods = append(res.AllMethods, key)
				if !want[key] {
					continue
				}
				delete(want, key)
				m, err := convert(verb, n.Path, info)
				if err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				res.Methods = append(res.Methods, m)
			}
			if err := walk(n.Children); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(tree); err != nil {
		return err
	}
	if len(want) > 0 {
		var missing []string
		for k := range want {
			missing = append(missing, k)
		}
		sort.Strings(missing)
		return fmt.Errorf("not in the schema: %v", missing)
	}
	sort.Strings(res.AllMethods)
	sort.Slice(res.Methods, func(i, j int) bool {
		return res.Methods[i].Path+" "+res.Methods[i].Method < res.Methods[j].Path+" "+res.Methods[j].Method
	})
	data, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// cutJS turns apidata.js ("const apiSchema = [ ... ]\n;" and viewer code)
// into its JSON array; JSON input passes through.
func cutJS(b []byte) []byte {
	t := bytes.TrimSpace(b)
	if len(t) > 0 && t[0] == '[' {
		return t
	}
	start := bytes.IndexByte(b, '[')
	end := bytes.Index(b, []byte("\n;\n"))
	if start < 0 || end < start {
		return b
	}
	return b[start:end]
}

func convert(verb, path string, raw json.RawMessage) (method, error) {
	var info struct {
		AllowToken  *int           `json:"allowtoken"`
		Protected   int            `json:"protected"`
		ProxyTo     string         `json:"proxyto"`
		Permissions any            `json:"permissions"`
		Parameters  map[string]any `json:"parameters"`
		Returns     map[string]any `json:"returns"`
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		return method{}, err
	}
	m := method{
		Method: verb, Path: path, AllowToken: 1, Protected: info.Protected, ProxyTo: info.ProxyTo,
		Permissions: stripPerm(info.Permissions),
		Parameters:  strip(info.Parameters),
		Returns:     strip(info.Returns),
	}
	if info.AllowToken != nil {
		m.AllowToken = *info.AllowToken
	}
	return m, nil
}

// strip keeps the validation keys of a schema, recursively.
func strip(s map[string]any) map[string]any {
	if s == nil {
		return nil
	}
	out := map[string]any{}
	for k, v := range s {
		if !keep[k] {
			continue
		}
		switch k {
		case "properties":
			props := map[string]any{}
			for name, p := range v.(map[string]any) {
				if pm, ok := p.(map[string]any); ok {
					props[name] = strip(pm)
				}
			}
			out[k] = props
		case "items", "format", "additionalProperties":
			if sub, ok := v.(map[string]any); ok {
				if k == "format" {
					f := map[string]any{}
					for name, p := range sub {
						if pm, ok := p.(map[string]any); ok {
							f[name] = strip(pm)
						}
					}
					out[k] = f
				} else {
					out[k] = strip(sub)
				}
			} else {
				out[k] = v
			}
		default:
			out[k] = v
		}
	}
	return out
}

// stripPerm drops the prose from a permissions object.
func stripPerm(p any) any {
	m, ok := p.(map[string]any)
	if !ok {
		return p
	}
	out := map[string]any{}
	for k, v := range m {
		if k != "description" {
			out[k] = v
		}
	}
	return out
}
