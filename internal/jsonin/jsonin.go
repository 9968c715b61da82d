// Package jsonin decodes what clients send (manifests, tool arguments,
// JSON-RPC messages) by rules stricter than encoding/json's, so that what a
// client sent is never guessed at, and a proxy that parsed the same bytes
// cannot have understood something else.
//
// The library github.com/go-json-experiment/json (the basis of Go's
// encoding/json/v2) parses, and enforces most of the rules: a name given
// twice in one object is an error at any depth, and so are invalid UTF-8
// and lone surrogate escapes; names match case-sensitively; a number must
// fit the Go type it goes into. This package adds, in one hook the library
// calls for every value, what the library does not do:
//
//   - a struct field whose json tag has neither omitempty nor omitzero is
//     required, and null counts as absent; a key no field has is an error
//     naming it and the known ones;
//   - null is refused as an element of an array or a value of a map (the
//     library would store a zero);
//   - an integer field takes a number written with a fraction or an
//     exponent when it is integral (60.0, 1e2), as JSON Schema's "integer"
//     does;
//   - a json.RawMessage field takes any JSON value, checked by the same
//     rules and nested at most MaxDepth deep, as the bytes it was given;
//   - every error is a *delegate.FieldError naming the value at fault in
//     delegate's notation ("manifest.files[2].content") and the rule in
//     words an agent can act on.
package jsonin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/delegate-dev/delegate"
)

// MaxDepth bounds nesting: no input of ours nests deeper than a few levels.
const MaxDepth = 64

// Decode reads data, exactly one JSON value, into v (a non-nil pointer) by
// the package's rules. Every error is a *delegate.FieldError whose Field
// is the path of the value at fault under prefix; with an empty prefix the
// fields of v are named alone and v itself is "". A json.RawMessage in v
// is a slice of data.
//
// Supported: structs, pointers, strings, bools, ints, uints, floats,
// slices, maps with string keys, json.RawMessage.
func Decode(data []byte, v any, prefix string) error {
	return defaultDecoder.Decode(data, v, prefix)
}

// Check reports whether data is one JSON value by the rules of Decode (valid
// UTF-8, no duplicate keys, at most MaxDepth deep), naming the first
// problem.
func Check(data []byte, prefix string) error {
	var raw json.RawMessage
	return Decode(data, &raw, prefix)
}

var defaultDecoder Decoder

// A Decoder decodes as Decode does, and remembers what it learnt of the Go
// types it decoded into. It is safe for concurrent use; the zero value is
// ready.
type Decoder struct {
	fields sync.Map // reflect.Type → *structInfo
	once   sync.Once
	opts   jsonv2.Options
}

// Decode is the package's Decode.
func (jd *Decoder) Decode(data []byte, v any, prefix string) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("jsonin: want a non-nil pointer, got %T", v)
	}
	if t := bytes.TrimSpace(data); len(t) == 0 || string(t) == "null" {
		return &delegate.FieldError{Field: prefix, Rule: "required (" + kindName(rv.Elem().Type()) + ")"}
	}
	jd.once.Do(func() {
		// The library's defaults refuse duplicate names and invalid
		// UTF-8; unknown members the package refuses itself, naming the
		// known ones. The hook is for the values the library decodes
		// (inside an interface, say): it hands back those the package
		// has rules for.
		jd.opts = jsonv2.JoinOptions(jsonv2.DefaultOptionsV2(), jsonv2.WithUnmarshalers(jsonv2.UnmarshalFromFunc(jd.value)))
	})
	// The library's tokenizer reads a bytes.Buffer in place (no copy);
	// the package walks the value itself, so that a short message pays
	// for no per-value dispatch.
	d := decoders.Get().(*pooledDecoder)
	d.buf = bytes.NewBuffer(data)
	d.dec.Reset(d.buf, jd.opts)
	err := jd.decode(&d.dec, rv.Elem())
	if err == nil {
		err = end(&d.dec)
	}
	d.dec.Reset(noInput) // lets go of data
	d.buf = nil
	decoders.Put(d)
	if err == nil {
		return nil
	}
	var u unknownFields
	if errors.As(err, &u) {
		return u.join(prefix)
	}
	var fe *delegate.FieldError
	if !errors.As(err, &fe) {
		fe = explain(err, "", rv.Elem().Type())
	}
	return &delegate.FieldError{Field: join(prefix, fe.Field), Rule: fe.Rule}
}

// unknownFields are the members of objects that name no field of theirs:
// an object reads on past them and past its members', and returns them
// all at its end.
type unknownFields []*delegate.FieldError

func (u unknownFields) Error() string { return u.join("").Error() }

// add keeps err's unknown fields when it is unknownFields (whose value
// was read to its end: the container reads on) and says whether it was.
func (u *unknownFields) add(err error) bool {
	var more unknownFields
	if !errors.As(err, &more) {
		return false
	}
	*u = append(*u, more...)
	return true
}

// err is u as the error of the container that read them, nil for none.
func (u unknownFields) err() error {
	if len(u) == 0 {
		return nil
	}
	return u
}

// join is the one error that names them all, each under prefix: the
// first as the field at fault, the others after it, each object's known
// fields said once.
func (u unknownFields) join(prefix string) *delegate.FieldError {
	first := &delegate.FieldError{Field: join(prefix, u[0].Field), Rule: u[0].Rule}
	if len(u) == 1 {
		return first
	}
	said := map[string]bool{u[0].Rule: true}
	others := make([]string, 0, len(u)-1)
	for _, fe := range u[1:] {
		name := join(prefix, fe.Field)
		if !said[fe.Rule] {
			said[fe.Rule] = true
			name += " (" + strings.TrimPrefix(fe.Rule, "unknown field (")
		}
		others = append(others, name)
	}
	first.Rule += fmt.Sprintf("; %d more unknown: %s", len(others), strings.Join(others, ", "))
	return first
}

// seconds reads a duration string ("10m") into an int or *int field
// tagged delegate:"seconds" (an integer goes the usual way).
func seconds(dec *jsontext.Decoder, rv reflect.Value) error {
	k := dec.PeekKind()
	val, err := dec.ReadValue()
	if err != nil {
		return err
	}
	if k != '"' {
		return &ruleError{`must be seconds or a duration like "10m" (got ` + jsonKindName(k) + ")"}
	}
	str, err := unquote(val)
	if err != nil {
		return err
	}
	n, err := delegate.ParseSeconds(str)
	if err != nil {
		var fe *delegate.FieldError
		errors.As(err, &fe)
		return &ruleError{fe.Rule}
	}
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			rv.Set(reflect.New(rv.Type().Elem()))
		}
		rv = rv.Elem()
	}
	if rv.OverflowInt(int64(n)) {
		return &ruleError{fmt.Sprintf("must be at most %d seconds (got %q)", math.MaxInt32, str)}
	}
	rv.SetInt(int64(n))
	return nil
}

// pooledDecoder is a tokenizer kept for the next Decode.
type pooledDecoder struct {
	dec jsontext.Decoder
	buf *bytes.Buffer
}

var decoders = sync.Pool{New: func() any { return new(pooledDecoder) }}

// noInput is what a pooled decoder reads between two Decodes: nothing (it
// is never read, only held).
var noInput = bytes.NewReader(nil)

// end checks that nothing but space follows the value.
func end(dec *jsontext.Decoder) error {
	off := dec.InputOffset()
	_, err := dec.ReadToken()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return &delegate.FieldError{Rule: fmt.Sprintf("must be a single JSON value (more follows at byte %d)", off)}
	}
	return err
}

// join puts a path under a prefix: "manifest" and "files[2]" make
// "manifest.files[2]", and an element's "[2]" goes on without a dot.
func join(prefix, path string) string {
	switch {
	case prefix == "":
		return path
	case path == "":
		return prefix
	case path[0] == '[':
		return prefix + path
	}
	return prefix + "." + path
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// networkType is manifest.network: a string ("none", "egress") or an
// allowlist object, read by the same rules as the rest.
var networkType = reflect.TypeFor[delegate.Network]()

// networkInput is an allowlist as a client writes it.
type networkInput struct {
	Allow []string `json:"allow"`
	Ask   bool     `json:"ask,omitempty"`
}

// network decodes a delegate.Network: a mode's name, or {"allow": [...],
// "ask": bool} (an allowlist, whose mode is implied).
func (jd *Decoder) network(dec *jsontext.Decoder, rv reflect.Value) error {
	switch dec.PeekKind() {
	case '"':
		var mode string
		if err := jd.decode(dec, reflect.ValueOf(&mode).Elem()); err != nil {
			return err
		}
		rv.Set(reflect.ValueOf(delegate.Network{Mode: delegate.NetworkMode(mode)}))
		return nil
	case '{':
		var in networkInput
		if err := jd.object(dec, reflect.ValueOf(&in).Elem()); err != nil {
			return err
		}
		if in.Allow == nil {
			in.Allow = []string{}
		}
		rv.Set(reflect.ValueOf(delegate.Network{Mode: delegate.NetworkAllowlist, Allow: in.Allow, Ask: in.Ask}))
		return nil
	}
	if _, err := dec.ReadValue(); err != nil {
		return err
	}
	return &ruleError{`must be "none", "egress" or an allowlist {"allow": ["pypi.org", "*.pythonhosted.org", "github.com:443"], "ask": false}`}
}

// value is the hook the library calls before it decodes any value into v
// (a pointer to it): the package decodes what it has rules for, and
// leaves the rest to the library (SkipFunc).
func (jd *Decoder) value(dec *jsontext.Decoder, v any) error {
	rv := reflect.ValueOf(v).Elem()
	if !handled(rv.Type()) {
		return jsonv2.SkipFunc
	}
	return jd.decode(dec, rv)
}

// handled says whether decode reads values of type t itself; the library
// reads the others (interfaces, []byte, types with their own methods).
func handled(t reflect.Type) bool {
	if t == rawMessageType {
		return true
	}
	if h, ok := handledTypes.Load(t); ok {
		return h.(bool)
	}
	h := handles(t)
	handledTypes.Store(t, h)
	return h
}

// handledTypes caches handles: types are few, and asking reflect whether
// a type has methods costs more than decoding a short string.
var handledTypes sync.Map // reflect.Type → bool

func handles(t reflect.Type) bool {
	if reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerV2Type) {
		return false
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Pointer, reflect.String, reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	case reflect.Slice:
		return t.Elem().Kind() != reflect.Uint8 // []byte: base64, as the library has it
	}
	return false
}

var (
	unmarshalerType   = reflect.TypeFor[json.Unmarshaler]()
	unmarshalerV2Type = reflect.TypeFor[jsonv2.UnmarshalerFrom]()
)

// decode reads the value at the cursor into rv. The library reads the
// tokens (and with them checks the syntax, UTF-8, escapes and duplicate
// names); decode puts them in Go values by the package's rules.
//
// An error about a value as a whole that decode finds before it has read
// the value's first token goes back to the caller unnamed, to be named by
// the caller, which knows where the value is (the decoder's pointer does
// not name an array element before it begins).
func (jd *Decoder) decode(dec *jsontext.Decoder, rv reflect.Value) error {
	t := rv.Type()
	if t == rawMessageType {
		return raw(dec, rv)
	}
	if t == networkType {
		return jd.network(dec, rv)
	}
	switch t.Kind() {
	case reflect.Pointer:
		if dec.PeekKind() == 'n' {
			if _, err := dec.ReadToken(); err != nil {
				return err
			}
			rv.SetZero()
			return nil
		}
		if rv.IsNil() {
			rv.Set(reflect.New(t.Elem()))
		}
		return jd.decode(dec, rv.Elem())
	case reflect.Struct:
		if handled(t) {
			return jd.object(dec, rv)
		}
	case reflect.Slice:
		if handled(t) {
			return jd.array(dec, rv)
		}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return fmt.Errorf("jsonin: unsupported map key type %s", t.Key())
		}
		if handled(t) {
			return jd.mapValue(dec, rv)
		}
	case reflect.String:
		if handled(t) {
			if k := dec.PeekKind(); k != '"' {
				return mismatch(dec, k, t)
			}
			val, err := dec.ReadValue() // checked, still quoted
			if err != nil {
				return err
			}
			str, err := unquote(val)
			if err != nil {
				return err
			}
			rv.SetString(str)
			return nil
		}
	case reflect.Bool:
		if handled(t) {
			if k := dec.PeekKind(); k != 't' && k != 'f' {
				return mismatch(dec, k, t)
			}
			tok, err := dec.ReadToken()
			if err != nil {
				return err
			}
			rv.SetBool(tok.Bool())
			return nil
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if handled(t) {
			return integer(dec, rv)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if handled(t) {
			lit, err := number(dec, t)
			if err != nil {
				return err
			}
			n, err := strconv.ParseUint(lit, 10, t.Bits())
			if err != nil {
				return &ruleError{fmt.Sprintf("must be an integer between 0 and %d (got %s)", uint64(math.MaxUint64)>>(64-t.Bits()), lit)}
			}
			rv.SetUint(n)
			return nil
		}
	case reflect.Float32, reflect.Float64:
		if handled(t) {
			lit, err := number(dec, t)
			if err != nil {
				return err
			}
			f, err := strconv.ParseFloat(lit, t.Bits())
			if err != nil {
				return &ruleError{"must be a finite number (got " + lit + ")"}
			}
			rv.SetFloat(f)
			return nil
		}
	}
	return jsonv2.UnmarshalDecode(dec, rv.Addr().Interface())
}

// number reads a JSON number's text for a value of type t.
func number(dec *jsontext.Decoder, t reflect.Type) (string, error) {
	if k := dec.PeekKind(); k != '0' {
		return "", mismatch(dec, k, t)
	}
	val, err := dec.ReadValue()
	if err != nil {
		return "", err
	}
	return string(val), nil
}

// mismatch is the error for a value of kind k where t was expected.
func mismatch(dec *jsontext.Decoder, k jsontext.Kind, t reflect.Type) error {
	// Not JSON at all ("nope" peeks as null): the library says what is
	// wrong; else the kinds differ.
	if _, err := dec.ReadValue(); err != nil {
		return err
	}
	return &kindError{want: t, got: k}
}

// structInfo is what the package knows of a struct type.
type structInfo struct {
	fields []structField
	known  string // the names, for the unknown-field message
}

type structField struct {
	name     string
	index    int
	required bool
	// seconds: an integer field tagged delegate:"seconds" that takes a
	// duration string too (delegate.ParseSeconds).
	seconds bool
}

func (jd *Decoder) structOf(t reflect.Type) *structInfo {
	if s, ok := jd.fields.Load(t); ok {
		return s.(*structInfo)
	}
	s := &structInfo{fields: make([]structField, 0, t.NumField())}
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		optional := false
		for o := range strings.SplitSeq(opts, ",") {
			optional = optional || o == "omitempty" || o == "omitzero"
		}
		s.fields = append(s.fields, structField{name: name, index: i, required: !optional, seconds: f.Tag.Get("delegate") == "seconds"})
		names = append(names, name)
	}
	s.known = strings.Join(names, ", ")
	jd.fields.Store(t, s)
	return s
}

// begin reads the '{' or '[' that opens a value of Go type t at the
// cursor, or says why it is not there.
func begin(dec *jsontext.Decoder, want jsontext.Kind, t reflect.Type) error {
	if k := dec.PeekKind(); k != want {
		return mismatch(dec, k, t)
	}
	if dec.StackDepth() >= MaxDepth {
		return errTooDeep
	}
	_, err := dec.ReadToken()
	return err
}

// kindError and errTooDeep are about a value as a whole, named by the
// caller (see value).
type kindError struct {
	want reflect.Type
	got  jsontext.Kind
}

func (e *kindError) Error() string {
	return "must be " + kindName(e.want) + " (got " + jsonKindName(e.got) + ")"
}

var errTooDeep = fmt.Errorf("nests deeper than %d levels", MaxDepth)

// object decodes {…} into the struct rv, member by member.
func (jd *Decoder) object(dec *jsontext.Decoder, rv reflect.Value) error {
	depth := dec.StackDepth() // of the object's container; the object's own is depth+1
	if err := begin(dec, '{', rv.Type()); err != nil {
		return err
	}
	info := jd.structOf(rv.Type())
	if len(info.fields) > 64 {
		return fmt.Errorf("jsonin: %s has more than 64 fields", rv.Type())
	}
	var seen uint64 // by position in fields
	last := -1      // the field read last
	var unknown unknownFields
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return explain(err, memberPath(dec, depth, info, last, err), nil)
		}
		i := info.find(name)
		if i < 0 {
			// Read on past it, so that one answer names every
			// misspelling, not one a try.
			key, _ := unquote(name)
			path := join(pathOf(dec, depth), key)
			if err := dec.SkipValue(); err != nil {
				return explain(err, path, nil)
			}
			unknown = append(unknown, &delegate.FieldError{Field: path, Rule: "unknown field (known: " + info.known + ")"})
			continue
		}
		last = i
		f := &info.fields[i]
		fv := rv.Field(f.index)
		if dec.PeekKind() == 'n' {
			// null: as if absent.
			if _, err := dec.ReadToken(); err != nil {
				return explain(err, join(pathOf(dec, depth), f.name), nil)
			}
			fv.SetZero()
			seen &^= 1 << i
			continue
		}
		seen |= 1 << i
		if f.seconds && dec.PeekKind() != '0' {
			err = seconds(dec, fv)
		} else {
			err = jd.decode(dec, fv)
		}
		if err != nil && !unknown.add(err) {
			return nameMember(err, func() string { return join(pathOf(dec, depth), f.name) }, fv.Type())
		}
	}
	if len(unknown) > 0 {
		// Before the required ones: a misspelled field is missing too.
		if _, err := dec.ReadToken(); err != nil {
			return explain(err, memberPath(dec, depth, info, last, err), nil)
		}
		return unknown
	}
	for i, f := range info.fields {
		if f.required && seen&(1<<i) == 0 {
			return &delegate.FieldError{Field: join(pathOf(dec, depth), f.name), Rule: "required (" + kindName(rv.Field(f.index).Type()) + ")"}
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return explain(err, memberPath(dec, depth, info, last, err), nil)
	}
	return nil
}

// find returns the index of the field a quoted name names, or -1. Names
// are compared as written when they have no escapes (no copy).
func (s *structInfo) find(quoted []byte) int {
	name := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		key, err := unquote(quoted)
		if err != nil {
			return -1
		}
		name = []byte(key)
	}
	for i := range s.fields {
		if s.fields[i].name == string(name) {
			return i
		}
	}
	return -1
}

// memberPath names what an error in an object's syntax is about: the
// member read last when the error is what follows it ("01" is the number
// 0, then an unexpected 1), else the object.
func memberPath(dec *jsontext.Decoder, depth int, info *structInfo, last int, err error) string {
	if last >= 0 && follows(err) {
		return join(pathOf(dec, depth), info.fields[last].name)
	}
	return pathOf(dec, depth)
}

// follows: err is about what follows a value, not the value.
func follows(err error) bool {
	var se *jsontext.SyntacticError
	return errors.As(err, &se) && se.Err != nil &&
		(strings.Contains(se.Err.Error(), "after object value") || strings.Contains(se.Err.Error(), "after array element"))
}

// unquote reads a JSON string the decoder has checked: as written when it
// has no escapes (a fast scan: base64 file contents are most of the bytes
// of a large request), else unescaped.
func unquote(quoted []byte) (string, error) {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return string(quoted[1 : len(quoted)-1]), nil
	}
	b, err := jsontext.AppendUnquote(nil, quoted)
	return string(b), err
}

// nameMember turns an error from decoding a member into a FieldError: the
// package's own errors already name their value; the library's, and
// those about the member as a whole, get the member's path.
func nameMember(err error, path func() string, t reflect.Type) error {
	var fe *delegate.FieldError
	if errors.As(err, &fe) {
		return fe
	}
	return explain(err, path(), t)
}

// array decodes […] into the slice rv.
func (jd *Decoder) array(dec *jsontext.Decoder, rv reflect.Value) error {
	depth := dec.StackDepth()
	t := rv.Type()
	if err := begin(dec, '[', t); err != nil {
		return err
	}
	rv.Set(reflect.MakeSlice(t, 0, 0))
	elem := func(i int) func() string {
		return func() string { return pathOf(dec, depth) + "[" + strconv.Itoa(i) + "]" }
	}
	i := 0
	var unknown unknownFields
	for ; dec.PeekKind() != ']'; i++ {
		if dec.PeekKind() == 'n' {
			return &delegate.FieldError{Field: elem(i)(), Rule: "must be " + kindName(t.Elem()) + " (got null)"}
		}
		rv.Set(reflect.Append(rv, reflect.New(t.Elem()).Elem()))
		if err := jd.decode(dec, rv.Index(i)); err != nil {
			if !unknown.add(err) {
				return nameMember(err, elem(i), t.Elem())
			}
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		if i > 0 && follows(err) {
			return explain(err, elem(i-1)(), nil)
		}
		return explain(err, pathOf(dec, depth), nil)
	}
	return unknown.err()
}

// mapValue decodes {…} into the map rv.
func (jd *Decoder) mapValue(dec *jsontext.Decoder, rv reflect.Value) error {
	depth := dec.StackDepth()
	t := rv.Type()
	if err := begin(dec, '{', t); err != nil {
		return err
	}
	if rv.IsNil() {
		rv.Set(reflect.MakeMap(t))
	}
	ev := reflect.New(t.Elem()).Elem()
	last := "" // the key read last
	var unknown unknownFields
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return explain(err, mapPath(dec, depth, last, err), nil)
		}
		key, err := unquote(name)
		if err != nil {
			return explain(err, pathOf(dec, depth), nil)
		}
		last = key
		keyPath := func() string { return join(pathOf(dec, depth), key) }
		if dec.PeekKind() == 'n' {
			return &delegate.FieldError{Field: keyPath(), Rule: "must be " + kindName(t.Elem()) + " (got null)"}
		}
		ev.SetZero()
		if err := jd.decode(dec, ev); err != nil {
			if !unknown.add(err) {
				return nameMember(err, keyPath, t.Elem())
			}
			continue
		}
		rv.SetMapIndex(reflect.ValueOf(key).Convert(t.Key()), ev)
	}
	if _, err := dec.ReadToken(); err != nil {
		return explain(err, mapPath(dec, depth, last, err), nil)
	}
	return unknown.err()
}

func mapPath(dec *jsontext.Decoder, depth int, last string, err error) string {
	if last != "" && follows(err) {
		return join(pathOf(dec, depth), last)
	}
	return pathOf(dec, depth)
}

// raw reads any JSON value into a json.RawMessage, token by token so that
// its depth is bounded and an error inside it is named exactly. The
// message is a slice of the input: the bytes as given.
func raw(dec *jsontext.Decoder, rv reflect.Value) error {
	depth := dec.StackDepth()
	dec.PeekKind() // the input is read into the buffer by then
	start, input := dec.InputOffset(), dec.UnreadBuffer()
	var stack []rawLevel // the containers open inside the value
	for {
		var p func() string // the path of the value (or end) at the cursor
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			switch k := dec.PeekKind(); {
			case k == '}' || k == ']':
				stack = stack[:n-1]
			case top.object:
				name, err := dec.ReadValue() // in the input: valid while it is
				if err != nil {
					return explain(err, rawPath(pathOf(dec, depth), stack[:n-1]), nil)
				}
				top.key = name
			default:
				top.index++
			}
			p = func() string { return rawPath(pathOf(dec, depth), stack) }
		}
		if k := dec.PeekKind(); (k == '{' || k == '[') && dec.StackDepth() >= MaxDepth {
			if p == nil {
				return errTooDeep
			}
			return &delegate.FieldError{Field: p(), Rule: errTooDeep.Error()}
		}
		tok, err := dec.ReadToken()
		if err != nil {
			if p == nil {
				return err // the value's first token: the caller names it
			}
			return explain(err, p(), nil)
		}
		switch tok.Kind() {
		case '{':
			stack = append(stack, rawLevel{object: true})
		case '[':
			stack = append(stack, rawLevel{index: -1})
		}
		if len(stack) == 0 {
			break
		}
	}
	n := dec.InputOffset() - start
	if n > int64(len(input)) {
		// The library reads a []byte input in place; anything else is a
		// change in it that this package must follow.
		return errors.New("jsonin: the decoder's buffer does not hold the raw value")
	}
	// The value's bytes: after what separates it from what came before.
	v := bytes.TrimLeft(input[:n], " \t\r\n:,")
	rv.SetBytes(v[:len(v):len(v)])
	return nil
}

// rawLevel is an object or array open inside a raw value: the key or the
// index of the member being read.
type rawLevel struct {
	object bool
	key    []byte // quoted, as read
	index  int
}

func rawPath(path string, stack []rawLevel) string {
	for _, l := range stack {
		if l.object {
			key, _ := unquote(l.key)
			path = join(path, key)
		} else if l.index >= 0 {
			path += "[" + strconv.Itoa(l.index) + "]"
		}
	}
	return path
}

// integer reads a JSON number into an int field: an integer in range, or
// an integral number written with a fraction or exponent.
func integer(dec *jsontext.Decoder, rv reflect.Value) error {
	lit, err := number(dec, rv.Type())
	if err != nil {
		return err // the caller names it
	}
	bits := rv.Type().Bits()
	n, err := strconv.ParseInt(lit, 10, bits)
	if errors.Is(err, strconv.ErrSyntax) {
		// 60.0 or 6e1: an integer all the same, if exactly one.
		f, ferr := strconv.ParseFloat(lit, 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return &ruleError{"must be an integer (got " + lit + ")"}
		}
		n, err = int64(f), nil
		if rv.OverflowInt(n) {
			err = strconv.ErrRange
		}
	}
	if err != nil {
		return &ruleError{fmt.Sprintf("must be an integer between %d and %d (got %s)", int64(-1)<<(bits-1), uint64(1)<<(bits-1)-1, lit)}
	}
	rv.SetInt(n)
	return nil
}

// ruleError is a rule a value broke, named by the caller.
type ruleError struct{ rule string }

func (e *ruleError) Error() string { return e.rule }

// explain turns an error about the value at path (of Go type t, when
// known) into a FieldError in delegate's words.
func explain(err error, path string, t reflect.Type) *delegate.FieldError {
	fe := func(format string, args ...any) *delegate.FieldError {
		return &delegate.FieldError{Field: path, Rule: fmt.Sprintf(format, args...)}
	}
	var (
		ke *kindError
		re *ruleError
	)
	switch {
	case errors.As(err, &ke):
		return fe("%s", ke.Error())
	case errors.As(err, &re):
		return fe("%s", re.rule)
	case errors.Is(err, errTooDeep):
		return fe("%s", errTooDeep.Error())
	}
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		switch {
		case errors.Is(se.Err, jsontext.ErrDuplicateName):
			// A duplicate is found as its name is read: path is its
			// object's.
			path = join(path, se.JSONPointer.LastToken())
			return fe("duplicate key")
		case errors.Is(se.Err, io.ErrUnexpectedEOF), errors.Is(se.Err, io.EOF):
			return fe("not valid JSON: the input ends where a value or the end of a string was expected")
		}
		msg := se.Err.Error()
		switch {
		case strings.Contains(msg, "invalid UTF-8"):
			return fe("not valid UTF-8 (at byte %d)", se.ByteOffset)
		case strings.Contains(msg, "surrogate"):
			return fe("not valid JSON: a lone UTF-16 surrogate escape at byte %d", se.ByteOffset)
		case strings.Contains(msg, "after top-level value"):
			return fe("must be a single JSON value (more follows at byte %d)", se.ByteOffset)
		case strings.Contains(msg, "invalid escape"):
			return fe("not valid JSON: %s at byte %d; expected an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)", msg, se.ByteOffset)
		case strings.Contains(msg, "invalid character") && strings.Contains(msg, "in string"):
			return fe("not valid JSON: control character in a string at byte %d (escape it)", se.ByteOffset)
		case strings.Contains(msg, "after object name"):
			return fe("not valid JSON: %s at byte %d; expected ':'", msg, se.ByteOffset)
		}
		return fe("not valid JSON: %s at byte %d", msg, se.ByteOffset)
	}
	var sem *jsonv2.SemanticError
	if errors.As(err, &sem) {
		if t == nil {
			t = sem.GoType
		}
		switch {
		case errors.Is(sem.Err, strconv.ErrRange) || (sem.Err != nil && strings.Contains(sem.Err.Error(), "out of range")):
			return fe("%s", rangeRule(t))
		case sem.JSONKind != 0 && t != nil:
			return fe("must be %s (got %s)", kindName(t), jsonKindName(sem.JSONKind))
		}
		if sem.Err != nil {
			return fe("%v", sem.Err)
		}
	}
	return fe("%v", err)
}

// rangeRule says what range a number must be in.
func rangeRule(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "number out of range"
	}
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("must be an integer between 0 and %d", uint64(math.MaxUint64)>>(64-t.Bits()))
	case reflect.Float32, reflect.Float64:
		return "must be a finite number"
	}
	return "number out of range"
}

// jsonKindName names a JSON kind in words.
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case '0':
		return "a number"
	}
	return "nothing"
}

// kindName says in words what a Go type takes in JSON.
func kindName(t reflect.Type) string {
	if t == rawMessageType {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return kindName(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array"
	case reflect.String:
		if o, ok := reflect.Zero(t).Interface().(interface{ OneOf() []string }); ok {
			return "one of " + strings.Join(o.OneOf(), ", ")
		}
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// pathOf is the path, in delegate's notation, of the value the decoder
// is inside at depth+1: that is, of the value a hook began at depth depth,
// asked while the hook is still inside it. The library's pointer names,
// at each level, the member or element read last, which for every level
// down to depth is the one that holds the value.
func pathOf(dec *jsontext.Decoder, depth int) string {
	if depth == 0 {
		return ""
	}
	var b strings.Builder
	level := 0
	for seg := range dec.StackPointer().Tokens() {
		if level++; level > depth {
			break
		}
		if kind, _ := dec.StackIndex(level); kind == '[' {
			b.WriteString("[" + seg + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}
