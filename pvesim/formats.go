package pvesim

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// formats are the named formats of PVE::JSONSchema (and the modules that
// register more) that the simulated methods use and whose check matters
// to a client. Each returns the error PVE dies with, trailing newline
// included. Named formats not listed here (pve-qm-boot, pve-volume-id
// and other config internals) are accepted unchecked: see Unchecked.
var formats = map[string]func(string) error{
	"pve-vmid":       reFormat(`^[1-9][0-9]{2,8}$`, "value does not look like a valid VM ID"),
	"pve-node":       reFormat(`^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`, "value does not look like a valid node name"),
	"dns-name":       dnsName,
	"pve-tag":        reFormat(`(?i)^[a-z0-9_][a-z0-9_\-+.]*$`, "invalid characters in tag"),
	"mac-addr":       reFormat(`(?i)^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$`, "value does not look like a valid unicast MAC address"),
	"pve-configid":   quotedFormat(`(?i)^[a-z][a-z0-9_-]+$`, "invalid configuration ID '%s'"),
	"pve-bridge-id":  quotedFormat(`^[-_.\w\d]+$`, "invalid bridge ID '%s'"),
	"pve-storage-id": quotedFormat(`(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$`, "storage ID '%s' contains illegal characters"),
	// pve-storage Plugin.pm verify_content; pve-common JSONSchema.pm
	// verify_task_status_type.
	"pve-storage-content": func(s string) error {
		if !slices.Contains(validContent, s) {
			return fmt.Errorf("invalid content type '%s'\n", s)
		}
		return nil
	},
	"pve-task-status-type": func(s string) error {
		switch strings.ToLower(s) {
		case "ok", "error", "warning", "unknown":
			return nil
		}
		return fmt.Errorf("invalid status '%s'\n", s)
	},
	"pve-poolid": quotedFormat(`^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$`, "pool name '%s' contains invalid characters"),
	// pve-access-control: AccessControl.pm and Auth/Plugin.pm.
	"pve-roleid":  quotedFormat(`^[A-Za-z0-9.\-_]+$`, "role name '%s' contains invalid characters"),
	"pve-groupid": quotedFormat(`^[A-Za-z0-9.\-_]+$`, "group name '%s' contains invalid characters"),
	"pve-userid":  verifyUsername,
	"pve-tokenid": func(s string) error {
		if _, _, ok := splitTokenID(s); !ok {
			return fmt.Errorf("value '%s' does not look like a valid token ID\n", s)
		}
		return nil
	},
	"urlencoded": func(s string) error {
		if !urlencodedRe().MatchString(s) {
			return fmt.Errorf("invalid urlencoded string: %s\n", s)
		}
		return nil
	},
	"disk-size": func(s string) error {
		if _, ok := parseSize(s); !ok {
			return fmt.Errorf("value does not look like a valid disk size: %s\n", s)
		}
		return nil
	},
	// pve-firewall Firewall.pm.
	"IPorCIDRorAlias": func(s string) error {
		if fwAliasRe().MatchString(s) {
			return nil
		}
		return verifyIPOrCIDR(s)
	},
	"pve-fw-addr-spec":     verifyAddrSpec,
	"pve-fw-dport-spec":    verifyPortSpec,
	"pve-fw-sport-spec":    verifyPortSpec,
	"pve-fw-protocol-spec": verifyProtocol,
	"CIDR": func(s string) error {
		if p, err := netip.ParsePrefix(strings.TrimSuffix(s, "\n")); err == nil && p.Bits() > 7 {
			return nil
		}
		return errors.New("value does not look like a valid CIDR network\n")
	},
	"address": func(s string) error {
		if _, err := netip.ParseAddr(s); err == nil || dnsName(s) == nil {
			return nil
		}
		return fmt.Errorf("value does not look like a valid address: %s\n", s)
	},
	"pve-startup-order": func(s string) error {
		for _, p := range strings.Split(s, ",") {
			if strings.TrimSpace(p) != "" && !startupRe().MatchString(p) {
				return errors.New("unable to parse startup options\n")
			}
		}
		if s == "" {
			return errors.New("unable to parse startup options\n")
		}
		return nil
	},
}

// objFormats are named formats that are property strings in PVE (their
// keys are not in the schema dump): the ones a client sets.
var objFormats = map[string]map[string]*Prop{
	// ipconfigN: cloud-init addresses, "ip=dhcp" or "ip=10.0.0.5/24,gw=10.0.0.1".
	"pve-qm-ipconfig": {
		"ip":  {Type: "string", Format: "pve-ipv4-config", Optional: true, MinLength: -1, MaxLength: -1},
		"gw":  {Type: "string", Format: "ipv4", Optional: true, MinLength: -1, MaxLength: -1},
		"ip6": {Type: "string", Format: "pve-ipv6-config", Optional: true, MinLength: -1, MaxLength: -1},
		"gw6": {Type: "string", Format: "ipv6", Optional: true, MinLength: -1, MaxLength: -1},
	},
}

func init() {
	ipv4 := func(s string) bool {
		a, err := netip.ParseAddr(strings.TrimSuffix(s, "\n"))
		return err == nil && a.Is4()
	}
	ipv6 := func(s string) bool {
		a, err := netip.ParseAddr(strings.TrimSuffix(s, "\n"))
		return err == nil && a.Is6()
	}
	cidr := func(s string, v4 bool) bool {
		p, err := netip.ParsePrefix(strings.TrimSuffix(s, "\n"))
		return err == nil && p.Addr().Is4() == v4 && p.Bits() > 7
	}
	check := func(ok func(string) bool, msg string) func(string) error {
		return func(s string) error {
			if !ok(s) {
				return errors.New(msg + "\n")
			}
			return nil
		}
	}
	formats["ipv4"] = check(ipv4, "value does not look like a valid IPv4 address")
	formats["ipv6"] = check(ipv6, "value does not look like a valid IPv6 address")
	formats["CIDRv4"] = check(func(s string) bool { return cidr(s, true) }, "value does not look like a valid IPv4 CIDR network")
	formats["CIDRv6"] = check(func(s string) bool { return cidr(s, false) }, "value does not look like a valid IPv6 CIDR network")
	formats["pve-ipv4-config"] = check(func(s string) bool {
		return s == "dhcp" || s == "manual" || cidr(s, true)
	}, "value does not look like a valid ipv4 network configuration")
	formats["pve-ipv6-config"] = check(func(s string) bool {
		return s == "auto" || s == "dhcp" || s == "manual" || cidr(s, false)
	}, "value does not look like a valid ipv6 network configuration")
}

var dnsName = reFormat(`^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`, "value does not look like a valid DNS name")

var (
	urlencodedRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[-%a-zA-Z0-9_.!~*'()]*\n?$`) })
	startupRe    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^((order=)?\d+|up=\d+|down=\d+)$`) })
	sizeRe       = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(\d+(\.\d+)?)([KMGT])?\n?$`) })
	kvRe         = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([^=]+)=(.+)\n?$`) })
	blankRe      = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\s*$`) })
)

// reFormat is a format checked by a regular expression (Perl's "$" also
// matches before a final newline, hence the optional "\n"), compiled when
// first used: the formats are set up when the binary starts, which every CLI
// command pays for, and most never check one.
func reFormat(re, msg string) func(string) error {
	rx := sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(strings.TrimSuffix(re, "$") + `\n?$`) })
	return func(s string) error {
		if !rx().MatchString(s) {
			return errors.New(msg + "\n")
		}
		return nil
	}
}

func quotedFormat(re, msg string) func(string) error {
	rx := sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(strings.TrimSuffix(re, "$") + `\n?$`) })
	return func(s string) error {
		if !rx().MatchString(s) {
			return fmt.Errorf(msg+"\n", s)
		}
		return nil
	}
}

// Unchecked lists the named formats the simulator accepts without a
// check (the real server parses them); tests report them so the list
// stays known.
func Unchecked(s *Schema) []string {
	seen := map[string]bool{}
	var walk func(p *Prop)
	walk = func(p *Prop) {
		if p == nil {
			return
		}
		if p.Format != "" {
			name, _ := strings.CutSuffix(p.Format, "-list")
			name, _ = strings.CutSuffix(name, "-opt")
			if formats[name] == nil && formats[p.Format] == nil && objFormats[p.Format] == nil && p.formatFn == nil {
				seen[p.Format] = true
			}
		}
		for _, sub := range p.FormatObj {
			walk(sub)
		}
		for _, sub := range p.Properties {
			walk(sub)
		}
		walk(p.Items)
	}
	for _, m := range s.methods {
		walk(m.Params)
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range seen {
			if !yield(k) {
				return
			}
		}
	})
}

// checkFormat is PVE::JSONSchema::check_format.
func checkFormat(schema *Prop, value, path string) error {
	if schema.FormatObj != nil {
		_, err := parsePropertyString(schema.FormatObj, value, path)
		return err
	}
	if schema.formatFn != nil {
		return schema.formatFn(value)
	}
	f := schema.Format
	if f == "regex" {
		return nil
	}
	if obj := objFormats[f]; obj != nil {
		_, err := parsePropertyString(obj, value, path)
		return err
	}
	if fn := formats[f]; fn != nil {
		return fn(value)
	}
	name, kind := f, ""
	if n, ok := strings.CutSuffix(f, "-list"); ok {
		name, kind = n, "list"
	} else if n, ok := strings.CutSuffix(f, "-opt"); ok {
		name, kind = n, "opt"
	}
	fn := formats[name]
	if fn == nil {
		return nil // see Unchecked
	}
	switch kind {
	case "list":
		for _, v := range splitList(value) {
			if err := fn(v); err != nil {
				return err
			}
		}
	case "opt":
		if perlTrue(value) {
			return fn(value)
		}
	default:
		return fn(value)
	}
	return nil
}

// splitList is PVE::Tools::split_list.
func splitList(s string) []string {
	if strings.Contains(s, "\x00") {
		return strings.Split(s, "\x00")
	}
	s = strings.NewReplacer(",", " ", ";", " ").Replace(s)
	return strings.Fields(s)
}

// parseBoolean is PVE::JSONSchema::parse_boolean.
func parseBoolean(s string) (string, bool) {
	switch strings.ToLower(s) {
	case "1", "on", "yes", "true":
		return "1", true
	case "0", "off", "no", "false":
		return "0", true
	}
	return s, false
}

// parsePropertyString is PVE::JSONSchema::parse_property_string: a
// "key=value,..." string (with one value allowed without its key) checked
// against an inline format. Errors read like PVE's exceptions.
func parsePropertyString(format map[string]*Prop, data, path string) (map[string]any, error) {
	res := map[string]any{}
	defaultKey := ""
	for _, part := range perlSplitComma(data) {
		if blankRe().MatchString(part) {
			continue
		}
		if m := kvRe().FindStringSubmatch(part); m != nil {
			k, v := m[1], m[2]
			if _, dup := res[k]; dup {
				return nil, fmt.Errorf("duplicate key in comma-separated list property: %s\n", k)
			}
			schema := format[k]
			if schema != nil && schema.Alias != "" {
				if schema.KeyAlias != "" {
					if _, dup := res[schema.KeyAlias]; dup {
						return nil, fmt.Errorf("key alias '%s' is already defined\n", schema.KeyAlias)
					}
					res[schema.KeyAlias] = k
				}
				k = schema.Alias
				schema = format[k]
			}
			if schema == nil {
				return nil, fmt.Errorf("invalid key in comma-separated list property: %s\n", k)
			}
			if schema.Type == "boolean" {
				v, _ = parseBoolean(v)
			}
			res[k] = v
			continue
		}
		if strings.Contains(part, "=") {
			return nil, errors.New("missing key in comma-separated list property\n")
		}
		if defaultKey != "" {
			return nil, fmt.Errorf("duplicate key in comma-separated list property: %s\n", defaultKey)
		}
		for _, k := range sortedKeys(format) {
			if !format[k].DefaultKey {
				continue
			}
			defaultKey = k
			if !perlTrue(res[k]) {
				res[k] = part
				break
			}
			return nil, fmt.Errorf("duplicate key in comma-separated list property: %s\n", defaultKey)
		}
		if defaultKey == "" {
			return nil, errors.New("value without key, but schema does not define a default key\n")
		}
	}
	errs := map[string]string{}
	no := false
	checkObject(path, &Prop{Properties: format, AdditionalProperties: &no}, res, errs)
	if len(errs) > 0 {
		var b strings.Builder
		b.WriteString("format error\n")
		for _, k := range sortedKeys(errs) {
			fmt.Fprintf(&b, "%s: %s\n", k, errs[k])
		}
		return nil, errors.New(b.String())
	}
	return res, nil
}

// perlSplitComma is Perl's split(/,/, $s): trailing empty fields go.
func perlSplitComma(s string) []string {
	parts := strings.Split(s, ",")
	for len(parts) > 0 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	return parts
}

// parseSize is PVE::JSONSchema::parse_size: "10G", "512M", "1.5T", bytes.
func parseSize(s string) (int64, bool) {
	m := sizeRe().FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	switch m[3] {
	case "K":
		f *= 1 << 10
	case "M":
		f *= 1 << 20
	case "G":
		f *= 1 << 30
	case "T":
		f *= 1 << 40
	}
	return int64(f), true
}

// formatSize is PVE::JSONSchema::format_size: the largest exact unit.
func formatSize(n int64) string {
	units := []string{"", "K", "M", "G", "T"}
	i := 0
	for i < len(units)-1 && n%1024 == 0 && n != 0 {
		n /= 1024
		i++
	}
	return strconv.FormatInt(n, 10) + units[i]
}

var usernameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+\n?$`) })

// verifyUsername is PVE::Auth::Plugin::verify_username, the pve-userid
// format.
func verifyUsername(s string) error {
	n := perlLength(s)
	switch {
	case n < 3:
		return fmt.Errorf("user name '%s' is too short\n", s)
	case n > 64:
		return fmt.Errorf("user name '%s' is too long (%d > 64)\n", s, n)
	case !usernameRe().MatchString(s):
		return fmt.Errorf("value '%s' does not look like a valid user name\n", s)
	}
	return nil
}
