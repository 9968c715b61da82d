package pve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Bool is a Proxmox boolean: 0/1, "0"/"1", or true/false on the wire.
type Bool bool

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bool) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(bytes.TrimSpace(data)), `"`)
	switch strings.ToLower(s) {
	case "1", "true", "on", "yes":
		*b = true
	case "0", "false", "off", "no", "", "null":
		*b = false
	default:
		return fmt.Errorf("pve: %s is not a boolean", data)
	}
	return nil
}

// Int is a Proxmox integer: a JSON number or a string holding one (as
// /cluster/nextid answers, and some config values).
type Int int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Int) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(bytes.TrimSpace(data)), `"`)
	if s == "" || s == "null" {
		*n = 0
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return fmt.Errorf("pve: %s is not an integer", data)
		}
		v = int64(f)
	}
	*n = Int(v)
	return nil
}

// Number is a Proxmox number: a JSON number or a string holding one.
type Number float64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Number) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(bytes.TrimSpace(data)), `"`)
	if s == "" || s == "null" {
		*n = 0
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("pve: %s is not a number", data)
	}
	*n = Number(f)
	return nil
}

// String is a Proxmox string that may come as a JSON number (a config's
// memory is "2048" or 2048 depending on the version).
type String string

// UnmarshalJSON implements json.Unmarshaler.
func (s *String) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var v string
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		*s = String(v)
		return nil
	}
	if string(data) == "null" {
		*s = ""
		return nil
	}
	*s = String(data)
	return nil
}

// bytesFromJSON undoes how Proxmox puts bytes in JSON strings: one
// character per byte (Perl's encoder on a byte string).
func bytesFromJSON(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xFF {
			return nil, fmt.Errorf("pve: character %U in byte data", r)
		}
		out = append(out, byte(r))
	}
	return out, nil
}

// bytesToJSON is the other way: Proxmox's Perl reads each character of
// a string it base64-encodes (stdin of agent/exec) as one byte.
func bytesToJSON(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

// boolInt is a boolean parameter as Proxmox wants it: 0 or 1.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
