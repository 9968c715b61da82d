package delegate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// DecodeJSON reads data, exactly one JSON value, into v (a non-nil
// pointer) by rules stricter than encoding/json's, so that what a client
// sent is never guessed at, and a proxy that parsed the same bytes cannot
// have understood something else:
//
//   - a key given twice in one object is an error (parsers disagree on
//     which one wins), at any depth;
//   - keys match field names exactly (encoding/json folds case), and a key
//     no field has is an error naming it and the known ones;
//   - a struct field whose json tag has neither omitempty nor omitzero is
//     required; null counts as absent;
//   - a pointer field is nil when absent, so a zero tells itself from
//     "not given";
//   - an integer field takes only integers in its range, a number field
//     only finite numbers;
//   - strings are valid UTF-8, escapes included (no lone surrogates);
//   - a json.RawMessage field takes any JSON value, checked by the same
//     rules (no duplicate keys in it either), as the bytes it was given.
//
// Every error is a *FieldError whose Field is the path of the value at
// fault under prefix ("manifest.files[2].content"); with an empty prefix,
// the fields of v are named alone and v itself is "".
//
// Supported: structs, pointers, strings, bools, ints, floats, slices, maps
// with string keys, json.RawMessage.
func DecodeJSON(data []byte, v any, prefix string) error {
	return new(JSONDecoder).Decode(data, v, prefix)
}

// A JSONDecoder decodes as DecodeJSON does, and remembers what it learnt
// of the Go types it decoded into, for a decoder that runs on every
// request. It is safe for concurrent use; the zero value is ready.
type JSONDecoder struct {
	fields sync.Map // reflect.Type → []structField
}

// Decode is DecodeJSON.
func (jd *JSONDecoder) Decode(data []byte, v any, prefix string) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("DecodeJSON: want a non-nil pointer, got %T", v)
	}
	d := jsonDecoder{data: data, types: jd}
	d.skipSpace()
	if d.pos == len(d.data) {
		return fieldErr(prefix, "required (%s)", kindName(rv.Elem().Type()))
	}
	if d.peek() == 'n' {
		if err := d.literal("null", prefix); err != nil {
			return err
		}
		if err := d.end(prefix); err != nil {
			return err
		}
		return fieldErr(prefix, "required (%s)", kindName(rv.Elem().Type()))
	}
	if err := d.value(rv.Elem(), prefix); err != nil {
		return err
	}
	return d.end(prefix)
}

// end checks that nothing but space follows the value.
func (d *jsonDecoder) end(path string) error {
	d.skipSpace()
	if d.pos < len(d.data) {
		return fieldErr(path, "must be a single JSON value (more follows at byte %d)", d.pos)
	}
	return nil
}

// CheckJSON reports whether data is one JSON value by the rules of
// DecodeJSON (valid UTF-8, no duplicate keys), naming the first problem.
func CheckJSON(data []byte, prefix string) error {
	var raw json.RawMessage
	return DecodeJSON(data, &raw, prefix)
}

// maxJSONDepth bounds nesting: no input of ours nests deeper than a few
// levels, and a bound keeps the recursion's stack small.
const maxJSONDepth = 64

type jsonDecoder struct {
	types *JSONDecoder
	data  []byte
	pos   int
	depth int
	buf   []byte // scratch for unescaping
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func (d *jsonDecoder) peek() byte { return d.data[d.pos] }

func (d *jsonDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// syntax is the error for input that is not the JSON expected here.
func (d *jsonDecoder) syntax(path, expected string) error {
	if d.pos >= len(d.data) {
		return fieldErr(path, "not valid JSON: the input ends where %s was expected", expected)
	}
	c := d.data[d.pos]
	got := strconv.QuoteRune(rune(c))
	if c >= utf8.RuneSelf {
		got = fmt.Sprintf("byte 0x%02x", c)
	}
	return fieldErr(path, "not valid JSON: %s at byte %d where %s was expected", got, d.pos, expected)
}

// jsonKindAt names the kind of the JSON value starting at the cursor.
func (d *jsonDecoder) jsonKindAt() string {
	switch d.peek() {
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
	}
	return "a number"
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

func (d *jsonDecoder) mismatch(path string, t reflect.Type) error {
	if c := d.peek(); !strings.ContainsRune("{[\"tfn-0123456789", rune(c)) {
		return d.syntax(path, "a value")
	}
	return fieldErr(path, "must be %s (got %s)", kindName(t), d.jsonKindAt())
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// value decodes the value at the cursor (not null: callers handle null)
// into rv.
func (d *jsonDecoder) value(rv reflect.Value, path string) error {
	if d.pos >= len(d.data) {
		return d.syntax(path, "a value")
	}
	t := rv.Type()
	if t == rawMessageType {
		start := d.pos
		if err := d.skipValue(path); err != nil {
			return err
		}
		rv.SetBytes(d.data[start:d.pos:d.pos])
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		if rv.IsNil() {
			rv.Set(reflect.New(t.Elem()))
		}
		return d.value(rv.Elem(), path)
	case reflect.Struct:
		if d.peek() != '{' {
			return d.mismatch(path, t)
		}
		return d.object(rv, path)
	case reflect.Map:
		if d.peek() != '{' {
			return d.mismatch(path, t)
		}
		if t.Key().Kind() != reflect.String {
			return fmt.Errorf("DecodeJSON: unsupported map key type %s", t.Key())
		}
		return d.mapValue(rv, path)
	case reflect.Slice:
		if d.peek() != '[' {
			return d.mismatch(path, t)
		}
		return d.array(rv, path)
	case reflect.String:
		if d.peek() != '"' {
			return d.mismatch(path, t)
		}
		s, err := d.str(path)
		if err != nil {
			return err
		}
		rv.SetString(s)
		return nil
	case reflect.Bool:
		switch d.peek() {
		case 't':
			rv.SetBool(true)
			return d.literal("true", path)
		case 'f':
			rv.SetBool(false)
			return d.literal("false", path)
		}
		return d.mismatch(path, t)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		lit, isInt, err := d.number(path, t)
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(lit, 10, t.Bits())
		if !isInt {
			// 60.0 or 6e1: an integer all the same, if exactly one.
			f, ferr := strconv.ParseFloat(lit, 64)
			if ferr != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
				return fieldErr(path, "must be an integer (got %s)", lit)
			}
			n, err = int64(f), nil
			if rv.OverflowInt(n) {
				err = strconv.ErrRange
			}
		}
		if err != nil {
			return fieldErr(path, "must be an integer between %d and %d (got %s)", int64(-1)<<(t.Bits()-1), uint64(1)<<(t.Bits()-1)-1, lit)
		}
		rv.SetInt(n)
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		lit, _, err := d.number(path, t)
		if err != nil {
			return err
		}
		n, err := strconv.ParseUint(lit, 10, t.Bits())
		if err != nil {
			return fieldErr(path, "must be an integer between 0 and %d (got %s)", uint64(math.MaxUint64)>>(64-t.Bits()), lit)
		}
		rv.SetUint(n)
		return nil
	case reflect.Float32, reflect.Float64:
		lit, _, err := d.number(path, t)
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(lit, t.Bits())
		if err != nil {
			return fieldErr(path, "must be a finite number (got %s)", lit)
		}
		rv.SetFloat(f)
		return nil
	}
	return fmt.Errorf("DecodeJSON: unsupported type %s at %s", t, path)
}

// structField is what DecodeJSON knows of one field of a struct.
type structField struct {
	name     string
	index    int
	required bool
}

func (jd *JSONDecoder) fieldsOf(t reflect.Type) []structField {
	if f, ok := jd.fields.Load(t); ok {
		return f.([]structField)
	}
	fields := make([]structField, 0, t.NumField())
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
		fields = append(fields, structField{name: name, index: i, required: !optional})
	}
	jd.fields.Store(t, fields)
	return fields
}

func (d *jsonDecoder) enter(path string) error {
	d.depth++
	if d.depth > maxJSONDepth {
		return fieldErr(path, "nests deeper than %d levels", maxJSONDepth)
	}
	return nil
}

// object decodes {…} into the struct rv.
func (d *jsonDecoder) object(rv reflect.Value, path string) error {
	if err := d.enter(path); err != nil {
		return err
	}
	defer func() { d.depth-- }()
	fields := d.types.fieldsOf(rv.Type())
	var seen uint64 // by position in fields; structs of ours have few
	if len(fields) > 64 {
		return fmt.Errorf("DecodeJSON: %s has more than 64 fields", rv.Type())
	}
	given := func(i int) bool { return seen&(1<<i) != 0 }
	d.pos++ // {
	err := d.members(path, func(key string) error {
		keyPath := join(path, key)
		i := slices.IndexFunc(fields, func(f structField) bool { return f.name == key })
		if i < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.name
			}
			return fieldErr(keyPath, "unknown field (known: %s)", strings.Join(names, ", "))
		}
		if given(i) {
			return fieldErr(keyPath, "duplicate key")
		}
		seen |= 1 << i
		fv := rv.Field(fields[i].index)
		if d.peek() == 'n' {
			// null: as if absent.
			seen &^= 1 << i
			fv.SetZero()
			return d.literal("null", keyPath)
		}
		return d.value(fv, keyPath)
	})
	if err != nil {
		return err
	}
	for i, f := range fields {
		if f.required && !given(i) {
			return fieldErr(join(path, f.name), "required (%s)", kindName(rv.Field(f.index).Type()))
		}
	}
	return nil
}

// mapValue decodes {…} into the map rv.
func (d *jsonDecoder) mapValue(rv reflect.Value, path string) error {
	if err := d.enter(path); err != nil {
		return err
	}
	defer func() { d.depth-- }()
	t := rv.Type()
	if rv.IsNil() {
		rv.Set(reflect.MakeMap(t))
	}
	d.pos++ // {
	return d.members(path, func(key string) error {
		keyPath := join(path, key)
		k := reflect.ValueOf(key).Convert(t.Key())
		if rv.MapIndex(k).IsValid() {
			return fieldErr(keyPath, "duplicate key")
		}
		if d.peek() == 'n' {
			return fieldErr(keyPath, "must be %s (got null)", kindName(t.Elem()))
		}
		ev := reflect.New(t.Elem()).Elem()
		if err := d.value(ev, keyPath); err != nil {
			return err
		}
		rv.SetMapIndex(k, ev)
		return nil
	})
}

// members reads the members of an object after its '{', calling member
// with the cursor on each value; member must consume it.
func (d *jsonDecoder) members(path string, member func(key string) error) error {
	d.skipSpace()
	if d.pos < len(d.data) && d.peek() == '}' {
		d.pos++
		return nil
	}
	var nulls []string // keys whose value was null, which a struct forgets
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.peek() != '"' {
			return d.syntax(path, "a key in quotes")
		}
		key, err := d.str(path)
		if err != nil {
			return err
		}
		keyPath := func() string { return join(path, key) } // on errors only
		d.skipSpace()
		if d.pos >= len(d.data) || d.peek() != ':' {
			return d.syntax(keyPath(), "':'")
		}
		d.pos++
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax(keyPath(), "a value")
		}
		if d.peek() == 'n' {
			if slices.Contains(nulls, key) {
				return fieldErr(keyPath(), "duplicate key")
			}
			nulls = append(nulls, key)
		} else if slices.Contains(nulls, key) {
			return fieldErr(keyPath(), "duplicate key")
		}
		if err := member(key); err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax(path, "',' or '}'")
		}
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return d.syntax(path, "',' or '}'")
		}
	}
}

// array decodes […] into the slice rv.
func (d *jsonDecoder) array(rv reflect.Value, path string) error {
	if err := d.enter(path); err != nil {
		return err
	}
	defer func() { d.depth-- }()
	d.pos++ // [
	t := rv.Type()
	rv.Set(reflect.MakeSlice(t, 0, 0))
	d.skipSpace()
	if d.pos < len(d.data) && d.peek() == ']' {
		d.pos++
		return nil
	}
	for i := 0; ; i++ {
		ep := path + "[" + strconv.Itoa(i) + "]"
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax(ep, "a value")
		}
		if d.peek() == 'n' {
			return fieldErr(ep, "must be %s (got null)", kindName(t.Elem()))
		}
		rv.Set(reflect.Append(rv, reflect.New(t.Elem()).Elem()))
		if err := d.value(rv.Index(i), ep); err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax(path, "',' or ']'")
		}
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return nil
		default:
			return d.syntax(path, "',' or ']'")
		}
	}
}

// skipValue checks the value at the cursor and moves past it.
func (d *jsonDecoder) skipValue(path string) error {
	if d.pos >= len(d.data) {
		return d.syntax(path, "a value")
	}
	switch c := d.peek(); {
	case c == '{':
		if err := d.enter(path); err != nil {
			return err
		}
		defer func() { d.depth-- }()
		d.pos++
		var keys []string // objects in messages are small; a map beyond a few
		var set map[string]struct{}
		return d.members(path, func(key string) error {
			keyPath := join(path, key)
			if set != nil {
				if _, dup := set[key]; dup {
					return fieldErr(keyPath, "duplicate key")
				}
				set[key] = struct{}{}
			} else if slices.Contains(keys, key) {
				return fieldErr(keyPath, "duplicate key")
			} else if keys = append(keys, key); len(keys) > 16 {
				set = make(map[string]struct{}, 2*len(keys))
				for _, k := range keys {
					set[k] = struct{}{}
				}
			}
			return d.skipValue(keyPath)
		})
	case c == '[':
		if err := d.enter(path); err != nil {
			return err
		}
		defer func() { d.depth-- }()
		d.pos++
		d.skipSpace()
		if d.pos < len(d.data) && d.peek() == ']' {
			d.pos++
			return nil
		}
		for i := 0; ; i++ {
			d.skipSpace()
			if err := d.skipValue(path + "[" + strconv.Itoa(i) + "]"); err != nil {
				return err
			}
			d.skipSpace()
			if d.pos >= len(d.data) {
				return d.syntax(path, "',' or ']'")
			}
			switch d.peek() {
			case ',':
				d.pos++
			case ']':
				d.pos++
				return nil
			default:
				return d.syntax(path, "',' or ']'")
			}
		}
	case c == '"':
		_, err := d.strBytes(path)
		return err
	case c == 't':
		return d.literal("true", path)
	case c == 'f':
		return d.literal("false", path)
	case c == 'n':
		return d.literal("null", path)
	case c == '-' || (c >= '0' && c <= '9'):
		_, _, err := d.number(path, nil)
		return err
	}
	return d.syntax(path, "a value")
}

func (d *jsonDecoder) literal(word, path string) error {
	if !bytes.HasPrefix(d.data[d.pos:], []byte(word)) {
		return d.syntax(path, "a value")
	}
	d.pos += len(word)
	return nil
}

// number reads a JSON number and returns its text and whether it is
// written as an integer. t (nil when skipping) names the expected type in
// a mismatch.
func (d *jsonDecoder) number(path string, t reflect.Type) (lit string, isInt bool, err error) {
	start := d.pos
	c := d.peek()
	if c != '-' && (c < '0' || c > '9') {
		if t != nil {
			return "", false, d.mismatch(path, t)
		}
		return "", false, d.syntax(path, "a value")
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	if c == '-' {
		d.pos++
	}
	intStart := d.pos
	if digits() == 0 {
		return "", false, d.syntax(path, "a digit")
	}
	if d.data[intStart] == '0' && d.pos-intStart > 1 {
		d.pos = intStart + 1
		return "", false, d.syntax(path, "no leading zero")
	}
	isInt = true
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		isInt = false
		if digits() == 0 {
			return "", false, d.syntax(path, "a digit")
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		isInt = false
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return "", false, d.syntax(path, "a digit")
		}
	}
	return string(d.data[start:d.pos]), isInt, nil
}

// str reads a JSON string as a Go string.
func (d *jsonDecoder) str(path string) (string, error) {
	b, err := d.strBytes(path)
	return string(b), err
}

// strBytes reads a JSON string at the cursor and returns its content,
// unescaped: a slice of the input when it has no escapes, else of d.buf
// (valid until the next call).
func (d *jsonDecoder) strBytes(path string) ([]byte, error) {
	d.pos++ // "
	start := d.pos
	data := d.data
	// The fast path: no escapes, ASCII. Base64 file contents are all of
	// this kind, and they are most of the bytes of a large request.
	i := d.pos
	for i < len(data) {
		c := data[i]
		if c == '"' {
			d.pos = i + 1
			return data[start:i], nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	d.pos = i
	buf := append(d.buf[:0], data[start:i]...)
	for d.pos < len(data) {
		c := data[d.pos]
		switch {
		case c == '"':
			d.pos++
			d.buf = buf
			return buf, nil
		case c < 0x20:
			return nil, fieldErr(path, "not valid JSON: control character 0x%02x in a string at byte %d (escape it)", c, d.pos)
		case c == '\\':
			if d.pos+1 >= len(data) {
				d.pos++
				return nil, d.syntax(path, "an escape")
			}
			e := data[d.pos+1]
			d.pos += 2
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, ok := d.hex4()
				if !ok {
					return nil, d.syntax(path, "four hex digits after \\u")
				}
				if utf16.IsSurrogate(r) {
					// A pair, or a lone half: no UTF-8 text has one.
					var r2 rune = -1
					if d.pos+1 < len(data) && data[d.pos] == '\\' && data[d.pos+1] == 'u' {
						d.pos += 2
						if r2, ok = d.hex4(); !ok {
							return nil, d.syntax(path, "four hex digits after \\u")
						}
					}
					if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
						return nil, fieldErr(path, "not valid JSON: a lone UTF-16 surrogate escape before byte %d", d.pos)
					}
				}
				buf = utf8.AppendRune(buf, r)
			default:
				d.pos--
				return nil, d.syntax(path, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)")
			}
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			d.pos++
		default:
			r, size := utf8.DecodeRune(data[d.pos:])
			if r == utf8.RuneError && size <= 1 {
				return nil, fieldErr(path, "not valid UTF-8 (byte 0x%02x at byte %d)", c, d.pos)
			}
			buf = append(buf, data[d.pos:d.pos+size]...)
			d.pos += size
		}
	}
	d.buf = buf
	return nil, d.syntax(path, "the closing '\"' of a string")
}

func (d *jsonDecoder) hex4() (rune, bool) {
	if d.pos+4 > len(d.data) {
		return 0, false
	}
	var r rune
	for _, c := range d.data[d.pos : d.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	d.pos += 4
	return r, true
}
