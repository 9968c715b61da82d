package pvesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// The subset of the official API schema for the methods pvesim serves,
// extracted by internal/schemagen, is AGPL-3.0 data (see
// schema/NOTICE.md). It is kept in the source tree and read at run time,
// never embedded in the delegate binary.
//
//go:generate go run ./internal/schemagen -in ../../shared/data/pve-api/pve9-api-schema.json -out schema/pve-api-subset.json -pve 9.x
//go:generate go run ./internal/schemagen -in ../../shared/data/pve-api/pve8-api-schema.json -out schema/pve8-api-subset.json -pve 8.4

// SchemaEnv names a schema file to use instead of the source tree's (the
// PVE 9 subset; the PVE 8 one, pve8-api-subset.json, is looked for next
// to it).
const SchemaEnv = "DELEGATE_PVE_SCHEMA"

// pve8SchemaName is the PVE 8.4 subset's file, next to the PVE 9 one.
const pve8SchemaName = "pve8-api-subset.json"

// SchemaFile finds the schema subset: $DELEGATE_PVE_SCHEMA, else
// pvesim/schema/pve-api-subset.json in the source tree this package was
// built from, or under the current directory or its parent.
func SchemaFile() (string, error) {
	if p := os.Getenv(SchemaEnv); p != "" {
		return p, nil
	}
	var candidates []string
	if _, src, _, ok := runtime.Caller(0); ok && filepath.IsAbs(src) {
		candidates = append(candidates, filepath.Join(filepath.Dir(src), "schema", "pve-api-subset.json"))
	}
	candidates = append(candidates,
		filepath.Join("pvesim", "schema", "pve-api-subset.json"),
		filepath.Join("schema", "pve-api-subset.json"),
		filepath.Join("..", "pvesim", "schema", "pve-api-subset.json"))
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c, nil
		}
	}
	return "", errors.New("the Proxmox API schema subset (AGPL-3.0 data, not built into delegate) was not found: " +
		"run from the delegate source tree or set " + SchemaEnv + " to pvesim/schema/pve-api-subset.json")
}

// indexed is how many numbered keys a "name[n]" property stands for
// (qemu-server's MAX_NETS, MAX_SCSI_DISKS and friends, pve-container's
// MAX_MOUNT_POINTS, MAX_DEVICES and MAX_LXC_NETWORKS); the schema dump
// folds net0..net31 into "net[n]", the running server checks each one.
var indexed = map[string]int{
	"net": 32, "ipconfig": 32, "ide": 4, "sata": 6, "scsi": 31, "virtio": 16,
	"unused": 256, "usb": 14, "serial": 4, "parallel": 3, "hostpci": 16,
	"numa": 8, "virtiofs": 10, "mp": 256, "dev": 256,
	"acmedomain": 5, // a node's ACME domains (pve-manager PVE/NodeConfig.pm $MAXDOMAINS)
}

// Schema is the part of the official PVE API schema the simulator serves,
// with the list of every method of the full API.
type Schema struct {
	// PVE is the version the schema describes (for example "9.x").
	PVE     string
	methods []*Method
	all     []template // every method of the real API
}

// Method is one API method: what it takes, returns and needs.
type Method struct {
	Method     string // GET, POST, PUT, DELETE
	Path       string // template, e.g. /nodes/{node}/qemu/{vmid}/clone
	AllowToken bool
	Protected  bool
	ProxyTo    string // "node" when the call runs on the node it names
	// Permissions is the schema's permission object (check expressions).
	Permissions map[string]any
	Params      *Prop
	Returns     *Prop
	tpl         template
}

// Prop is a JSON-schema-like property as PVE::JSONSchema understands it.
type Prop struct {
	Type       string
	Optional   bool
	Enum       []string
	Minimum    string // as written in the schema (messages quote it)
	Maximum    string
	MinLength  int // -1 when unset
	MaxLength  int
	Pattern    string
	Format     string           // a named format, e.g. pve-vmid, pve-tag-list
	FormatObj  map[string]*Prop // an inline property-string format
	DefaultKey bool
	Alias      string
	KeyAlias   string
	Requires   string
	Items      *Prop
	Properties map[string]*Prop
	// AdditionalProperties: nil when unset (allowed), else whether
	// properties the schema does not name are allowed.
	AdditionalProperties *bool
	re                   *regexp.Regexp
	// formatFn checks a named format whose rule depends on the release
	// (pve-priv); it wins over the shared table of formats.
	formatFn func(string) error
}

type template struct {
	method string
	segs   []string
}

// schemaCache holds each major release's schema, read once: the files
// do not change while the program runs.
type schemaCache struct {
	once   sync.Once
	schema *Schema
	err    error
}

var schemas = map[int]*schemaCache{8: {}, 9: {}}

// LoadSchema reads the PVE 9 schema subset found by SchemaFile (once).
func LoadSchema() (*Schema, error) { return loadSchemaFor(9) }

// LoadSchemaFor reads the schema subset of a release ("8.2", "8.4" use
// the PVE 8.4 schema, "9.1" the PVE 9 one), once.
func LoadSchemaFor(pveVersion string) (*Schema, error) {
	rel, err := parseRelease(pveVersion)
	if err != nil {
		return nil, err
	}
	return loadSchemaFor(rel.major)
}

func loadSchemaFor(major int) (*Schema, error) {
	c := schemas[major]
	if c == nil {
		return nil, fmt.Errorf("pvesim: no schema for PVE %d", major)
	}
	c.once.Do(func() {
		path, err := SchemaFile()
		if err != nil {
			c.err = err
			return
		}
		if major == 8 {
			path = filepath.Join(filepath.Dir(path), pve8SchemaName)
		}
		c.schema, c.err = LoadSchemaFile(path)
	})
	return c.schema, c.err
}

// LoadSchemaFile reads a schema subset made by internal/schemagen.
func LoadSchemaFile(path string) (*Schema, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pvesim schema: %w", err)
	}
	s, err := parseSchema(data)
	if err != nil {
		return nil, fmt.Errorf("pvesim schema %s: %w", path, err)
	}
	return s, nil
}

func parseSchema(data []byte) (*Schema, error) {
	var raw struct {
		PVE     string `json:"pve"`
		Methods []struct {
			Method      string         `json:"method"`
			Path        string         `json:"path"`
			AllowToken  int            `json:"allowtoken"`
			Protected   int            `json:"protected"`
			ProxyTo     string         `json:"proxyto"`
			Permissions map[string]any `json:"permissions"`
			Parameters  map[string]any `json:"parameters"`
			Returns     map[string]any `json:"returns"`
		} `json:"methods"`
		AllMethods []string `json:"all_methods"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // keep "maximum": 999999999 as written
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("pvesim schema: %w", err)
	}
	s := &Schema{PVE: raw.PVE}
	for _, m := range raw.Methods {
		params, err := parseProp(m.Parameters, true)
		if err != nil {
			return nil, fmt.Errorf("pvesim schema: %s %s parameters: %w", m.Method, m.Path, err)
		}
		returns, err := parseProp(m.Returns, true)
		if err != nil {
			return nil, fmt.Errorf("pvesim schema: %s %s returns: %w", m.Method, m.Path, err)
		}
		s.methods = append(s.methods, &Method{
			Method: m.Method, Path: m.Path, AllowToken: m.AllowToken != 0, Protected: m.Protected != 0,
			ProxyTo: m.ProxyTo, Permissions: m.Permissions, Params: params, Returns: returns,
			tpl: newTemplate(m.Method, m.Path),
		})
	}
	s.bindPrivileges()
	for _, key := range raw.AllMethods {
		verb, path, ok := strings.Cut(key, " ")
		if !ok {
			return nil, fmt.Errorf("pvesim schema: bad method %q", key)
		}
		s.all = append(s.all, newTemplate(verb, path))
	}
	return s, nil
}

func newTemplate(method, path string) template {
	return template{method: method, segs: splitPath(path)}
}

func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// match returns the path parameters if path fits the template.
func (t template) match(method string, segs []string) (map[string]string, bool) {
	if method != t.method || len(segs) != len(t.segs) {
		return nil, false
	}
	var params map[string]string
	for i, ts := range t.segs {
		if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "}") {
			if segs[i] == "" {
				return nil, false
			}
			if params == nil {
				params = map[string]string{}
			}
			params[ts[1:len(ts)-1]] = segs[i]
			continue
		}
		if ts != segs[i] {
			return nil, false
		}
	}
	return params, true
}

// Lookup finds the method serving method+path (a concrete path such as
// /nodes/pve1/qemu/100/config) and its path parameters.
func (s *Schema) Lookup(method, path string) (*Method, map[string]string, bool) {
	segs := splitPath(path)
	// Fixed segments win over parameters, as in PVE's router: try the
	// templates with the most fixed segments first.
	var best *Method
	var bestParams map[string]string
	bestFixed := -1
	for _, m := range s.methods {
		params, ok := m.tpl.match(method, segs)
		if !ok {
			continue
		}
		if fixed := len(segs) - len(params); fixed > bestFixed {
			best, bestParams, bestFixed = m, params, fixed
		}
	}
	return best, bestParams, best != nil
}

// Privileges are the release's valid privileges, as its schema lists
// them: GET /access/roles/{roleid} returns one boolean per privilege
// (AccessControl.pm create_priv_properties).
func (s *Schema) Privileges() map[string]bool {
	out := map[string]bool{}
	for _, m := range s.methods {
		if m.Method == "GET" && m.Path == "/access/roles/{roleid}" && m.Returns != nil {
			for p := range m.Returns.Properties {
				out[p] = true
			}
		}
	}
	return out
}

// bindPrivileges gives the pve-priv formats (verify_privname) this
// release's privileges: PVE 8 knows VM.Monitor, PVE 9 VM.GuestAgent.*.
func (s *Schema) bindPrivileges() {
	privs := s.Privileges()
	check := func(v string) error {
		if !privs[v] {
			return fmt.Errorf("invalid privilege '%s'\n", v)
		}
		return nil
	}
	var walk func(p *Prop)
	walk = func(p *Prop) {
		if p == nil {
			return
		}
		switch p.Format {
		case "pve-priv":
			p.formatFn = check
		case "pve-priv-list":
			p.formatFn = func(v string) error {
				for _, priv := range splitList(v) {
					if err := check(priv); err != nil {
						return err
					}
				}
				return nil
			}
		}
		for _, sub := range p.Properties {
			walk(sub)
		}
		walk(p.Items)
	}
	for _, m := range s.methods {
		walk(m.Params)
	}
}

// InRealAPI reports whether the full PVE API has method+path, which the
// simulator may not serve.
func (s *Schema) InRealAPI(method, path string) bool {
	segs := splitPath(path)
	for _, t := range s.all {
		if _, ok := t.match(method, segs); ok {
			return true
		}
	}
	return false
}

// Methods lists the methods of the subset, sorted by path and method.
func (s *Schema) Methods() []*Method {
	out := append([]*Method(nil), s.methods...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}

// parseProp converts a schema object. expand turns "net[n]" properties
// into net0..net31, as the running server has them.
func parseProp(m map[string]any, expand bool) (*Prop, error) {
	if m == nil {
		return nil, nil
	}
	p := &Prop{MinLength: -1, MaxLength: -1}
	for k, v := range m {
		var err error
		switch k {
		case "type":
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("type %v: only single types are supported", v)
			}
			p.Type = s
		case "optional":
			p.Optional = truthy(v)
		case "default_key":
			p.DefaultKey = truthy(v)
		case "enum":
			for _, e := range v.([]any) {
				p.Enum = append(p.Enum, fmt.Sprint(e))
			}
		case "minimum":
			p.Minimum = fmt.Sprint(v)
		case "maximum":
			p.Maximum = fmt.Sprint(v)
		case "minLength":
			p.MinLength, err = atoiAny(v)
		case "maxLength":
			p.MaxLength, err = atoiAny(v)
		case "pattern":
			p.Pattern = fmt.Sprint(v)
			p.re, err = perlRegexp(p.Pattern)
		case "format":
			switch f := v.(type) {
			case string:
				p.Format = f
			case map[string]any:
				p.FormatObj = map[string]*Prop{}
				for name, sub := range f {
					sm, _ := sub.(map[string]any)
					if p.FormatObj[name], err = parseProp(sm, false); err != nil {
						return nil, fmt.Errorf("format %s: %w", name, err)
					}
				}
			}
		case "alias":
			p.Alias = fmt.Sprint(v)
		case "keyAlias":
			p.KeyAlias = fmt.Sprint(v)
		case "requires":
			p.Requires = fmt.Sprint(v)
		case "items":
			sm, _ := v.(map[string]any)
			p.Items, err = parseProp(sm, false)
		case "additionalProperties":
			switch a := v.(type) {
			case map[string]any:
				t := true // an object schema: allowed (we do not check them)
				p.AdditionalProperties = &t
			default:
				b := truthy(a)
				p.AdditionalProperties = &b
			}
		case "properties":
			p.Properties = map[string]*Prop{}
			for name, sub := range v.(map[string]any) {
				sm, _ := sub.(map[string]any)
				sp, err := parseProp(sm, false)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
				base, isIndexed := strings.CutSuffix(name, "[n]")
				if !isIndexed || !expand {
					p.Properties[name] = sp
					continue
				}
				n, ok := indexed[base]
				if !ok {
					return nil, fmt.Errorf("%s: unknown count for an indexed property", name)
				}
				for i := range n {
					p.Properties[fmt.Sprintf("%s%d", base, i)] = sp
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	return p, nil
}

func truthy(v any) bool {
	switch t := v.(type) {
	case bool:
		return t
	case json.Number:
		return t.String() != "0"
	case string:
		return t != "" && t != "0"
	}
	return v != nil
}

func atoiAny(v any) (int, error) {
	var n int
	_, err := fmt.Sscan(fmt.Sprint(v), &n)
	return n, err
}

// perlRegexp compiles a schema pattern the way PVE applies it:
// m/^$pattern$/, where Perl's "$" also matches before a final newline.
// Perl syntax Go lacks is rewritten: "(?^:" (a group with default flags)
// and "(?>" (atomic; the same matches for a whole-string match) become
// plain groups, and "{,n}" (Perl 5.34+) is "{0,n}".
func perlRegexp(p string) (*regexp.Regexp, error) {
	p = strings.NewReplacer("(?^:", "(?:", "(?>", "(?:", "{,", "{0,").Replace(p)
	// Go's repeat counts stop at 1000: a larger bound (the 4096 of a
	// user's TFA "keys") is left open, a little laxer than Perl.
	p = bigRepeatRe().ReplaceAllStringFunc(p, func(m string) string {
		lo, _, _ := strings.Cut(strings.Trim(m, "{}"), ",")
		return "{" + lo + ",}"
	})
	return regexp.Compile(`^(?:` + p + `)\n?$`)
}

var bigRepeatRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\{\d+,\d{4,}\}`) })
