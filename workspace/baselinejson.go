package workspace

import (
	"encoding/json"
	"strconv"
)

// A baseline is stored and handed to clients as JSON, one object per file
// of the import: 1.7 MB for 10,000 files, which encoding/json wrote in
// 4.7 ms and read back (by reflection, checking the whole document first)
// in 15 ms of each job with a workspace (issue 41, item 3). JSON writes
// it with appends and ParseBaseline reads the form JSON writes in one
// pass; the bytes and the values are encoding/json's (TestBaselineJSON,
// FuzzParseBaseline), which anything else is still read by.

// JSON is the baseline as encoding/json writes it (json.Marshal(b)).
func (b *Baseline) JSON() []byte {
	out := make([]byte, 0, 64+len(b.Files)*160)
	out = append(out, `{"version":`...)
	out = strconv.AppendInt(out, int64(b.Version), 10)
	out = append(out, `,"kind":`...)
	out = appendJSONString(out, string(b.Kind))
	if b.Head != "" {
		out = append(out, `,"head":`...)
		out = appendJSONString(out, b.Head)
	}
	if b.Branch != "" {
		out = append(out, `,"branch":`...)
		out = appendJSONString(out, b.Branch)
	}
	if b.IncludeIgnored {
		out = append(out, `,"includeIgnored":true`...)
	}
	if b.Files == nil {
		return append(out, `,"files":null}`...)
	}
	out = append(out, `,"files":[`...)
	for i := range b.Files {
		f := &b.Files[i]
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"path":`...)
		out = appendJSONString(out, f.Path)
		out = append(out, `,"type":"`...)
		out = append(out, f.Type.String()...)
		out = append(out, `","mode":"`...)
		out = appendMode(out, f.Mode)
		out = append(out, `","size":`...)
		out = strconv.AppendInt(out, f.Size, 10)
		out = append(out, `,"mtime":`...)
		out = strconv.AppendInt(out, f.MTime, 10)
		if f.Target != "" {
			out = append(out, `,"target":`...)
			out = appendJSONString(out, f.Target)
		}
		if f.SHA256 != "" {
			out = append(out, `,"sha256":`...)
			out = appendJSONString(out, f.SHA256)
		}
		out = append(out, '}')
	}
	return append(out, "]}"...)
}

// appendMode is Mode.MarshalText's "%04o" of the permission bits.
func appendMode(out []byte, m Mode) []byte {
	v := uint64(m) & 0o7777
	for d := uint64(0o1000); d > 0; d /= 8 {
		out = append(out, byte('0'+v/d%8))
	}
	return out
}

// plainJSON tells whether encoding/json writes s as it is between quotes:
// printable ASCII other than the quote, the backslash and the three it
// escapes for HTML (<, >, &).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendJSONString appends s as encoding/json writes it; anything but a
// plain string is written by encoding/json itself.
func appendJSONString(out []byte, s string) []byte {
	if plainJSON(s) {
		out = append(out, '"')
		out = append(out, s...)
		return append(out, '"')
	}
	q, _ := json.Marshal(s) // a string always marshals
	return append(out, q...)
}

// ParseBaseline reads a baseline stored as JSON (what json.Unmarshal into
// a Baseline reads, with the same result and errors): the form JSON
// writes in one pass, anything else (spaces, escapes, keys in another
// order or case) with encoding/json.
func ParseBaseline(data []byte) (*Baseline, error) {
	p := baselineParser{data: data}
	if b, ok := p.baseline(); ok {
		return b, nil
	}
	b := &Baseline{}
	if err := json.Unmarshal(data, b); err != nil {
		return nil, err
	}
	return b, nil
}

// baselineParser reads the exact form Baseline.JSON writes; any other
// byte makes it give up (ok false), for encoding/json to read.
type baselineParser struct {
	data []byte
	i    int
}

func (p *baselineParser) lit(s string) bool {
	if len(p.data)-p.i < len(s) || string(p.data[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// str reads a string of printable ASCII without escapes (what
// encoding/json reads as those very bytes).
func (p *baselineParser) str() (string, bool) {
	if p.i >= len(p.data) || p.data[p.i] != '"' {
		return "", false
	}
	for j := p.i + 1; j < len(p.data); j++ {
		c := p.data[j]
		switch {
		case c == '"':
			s := string(p.data[p.i+1 : j])
			p.i = j + 1
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
	}
	return "", false
}

// int reads a JSON integer (no fraction, no exponent, no leading zero)
// that an int64 holds.
func (p *baselineParser) int() (int64, bool) {
	j := p.i
	neg := j < len(p.data) && p.data[j] == '-'
	if neg {
		j++
	}
	start := j
	var v uint64
	for j < len(p.data) && p.data[j] >= '0' && p.data[j] <= '9' {
		if j-start == 19 { // 20 digits: more than an int64 holds
			return 0, false
		}
		v = v*10 + uint64(p.data[j]-'0')
		j++
	}
	switch {
	case j == start, p.data[start] == '0' && j-start > 1:
		return 0, false
	case j < len(p.data) && (p.data[j] == '.' || p.data[j] == 'e' || p.data[j] == 'E'):
		return 0, false
	case neg && v > 1<<63, !neg && v > 1<<63-1:
		return 0, false // encoding/json's error, from encoding/json
	}
	p.i = j
	if neg {
		return int64(-v), true
	}
	return int64(v), true
}

func (p *baselineParser) baseline() (*Baseline, bool) {
	b := &Baseline{}
	var ok bool
	var v int64
	var s string
	if !p.lit(`{"version":`) {
		return nil, false
	}
	if v, ok = p.int(); !ok || v != int64(int(v)) {
		return nil, false
	}
	b.Version = int(v)
	if !p.lit(`,"kind":`) {
		return nil, false
	}
	if s, ok = p.str(); !ok {
		return nil, false
	}
	b.Kind = Kind(s)
	if p.lit(`,"head":`) {
		if b.Head, ok = p.str(); !ok {
			return nil, false
		}
	}
	if p.lit(`,"branch":`) {
		if b.Branch, ok = p.str(); !ok {
			return nil, false
		}
	}
	if p.lit(`,"includeIgnored":`) {
		switch {
		case p.lit("true"):
			b.IncludeIgnored = true
		case p.lit("false"):
		default:
			return nil, false
		}
	}
	switch {
	case p.lit(`,"files":null}`):
		return b, p.i == len(p.data)
	case !p.lit(`,"files":[`):
		return nil, false
	}
	b.Files = make([]FileState, 0, len(p.data)/160)
	if p.lit("]}") {
		return b, p.i == len(p.data)
	}
	for {
		f, ok := p.file()
		if !ok {
			return nil, false
		}
		b.Files = append(b.Files, f)
		if p.lit(",") {
			continue
		}
		if !p.lit("]}") {
			return nil, false
		}
		return b, p.i == len(p.data)
	}
}

func (p *baselineParser) file() (FileState, bool) {
	var f FileState
	var ok bool
	if !p.lit(`{"path":`) {
		return f, false
	}
	if f.Path, ok = p.str(); !ok {
		return f, false
	}
	switch {
	case p.lit(`,"type":"file"`):
		f.Type = TypeFile
	case p.lit(`,"type":"dir"`):
		f.Type = TypeDir
	case p.lit(`,"type":"symlink"`):
		f.Type = TypeSymlink
	default:
		return f, false
	}
	if !p.lit(`,"mode":"`) {
		return f, false
	}
	var m uint64
	j := p.i
	for ; j < len(p.data) && p.data[j] >= '0' && p.data[j] <= '7'; j++ {
		if j-p.i == 8 {
			return f, false
		}
		m = m*8 + uint64(p.data[j]-'0')
	}
	if j == p.i || m > 0o7777 || j >= len(p.data) || p.data[j] != '"' {
		return f, false
	}
	f.Mode = Mode(m)
	p.i = j + 1
	if !p.lit(`,"size":`) {
		return f, false
	}
	if f.Size, ok = p.int(); !ok {
		return f, false
	}
	if !p.lit(`,"mtime":`) {
		return f, false
	}
	if f.MTime, ok = p.int(); !ok {
		return f, false
	}
	if p.lit(`,"target":`) {
		if f.Target, ok = p.str(); !ok {
			return f, false
		}
	}
	if p.lit(`,"sha256":`) {
		if f.SHA256, ok = p.str(); !ok {
			return f, false
		}
	}
	return f, p.lit("}")
}
