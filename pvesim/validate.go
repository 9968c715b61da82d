package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Params are a request's parameters as the PVE API server sees them
// before validation: every scalar is a string (a form value, or a JSON
// number as written), a JSON boolean stays a bool, a repeated form key
// or a JSON array is a []any, a JSON object a map[string]any. Path
// parameters are not included.
type Params map[string]any

// Clone returns a deep copy.
func (p Params) Clone() Params {
	out := make(Params, len(p))
	for k, v := range p {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch t := v.(type) {
	case []any:
		c := make([]any, len(t))
		for i, e := range t {
			c[i] = cloneValue(e)
		}
		return c
	case map[string]any:
		c := make(map[string]any, len(t))
		for k, e := range t {
			c[k] = cloneValue(e)
		}
		return c
	}
	return v
}

// ParamError is Proxmox's "400 Parameter verification failed." with its
// per-parameter messages, worded as PVE::JSONSchema words them.
type ParamError struct {
	Errors map[string]string
}

func (e *ParamError) Error() string {
	keys := make([]string, 0, len(e.Errors))
	for k := range e.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("Parameter verification failed.")
	for _, k := range keys {
		fmt.Fprintf(&b, " %s: %s;", k, strings.TrimSpace(e.Errors[k]))
	}
	return strings.TrimSuffix(b.String(), ";")
}

// paramErr builds a ParamError for one parameter (raise_param_exc).
func paramErr(name, msg string) *ParamError {
	return &ParamError{Errors: map[string]string{name: msg}}
}

// ErrNotImplemented: no such method in the simulated API.
var ErrNotImplemented = errors.New("method not implemented")

// Validate checks a request the way the PVE API server does before it
// runs a handler: the route must exist, body and query parameters must
// not contradict the path, and all of them together must satisfy the
// method's schema. It returns the method, the merged parameters (path
// ones included, legacy formats normalized), and nil, a *ParamError, or
// ErrNotImplemented.
func (s *Schema) Validate(method, path string, params Params) (*Method, Params, error) {
	m, pathParams, ok := s.Lookup(method, path)
	if !ok {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, ErrNotImplemented)
	}
	merged, err := mergeParams(pathParams, params)
	if err != nil {
		return m, nil, err
	}
	return m, merged, m.check(merged)
}

// mergeParams adds the request's parameters to the path's, refusing a
// parameter that contradicts the path (pve-manager rest_handler).
func mergeParams(pathParams map[string]string, params Params) (Params, error) {
	merged := Params{}
	for k, v := range pathParams {
		merged[k] = v
	}
	perr := &ParamError{Errors: map[string]string{}}
	for k, v := range params {
		if pv, ok := pathParams[k]; ok {
			if s, isStr := v.(string); !isStr || s != pv {
				perr.Errors[k] = "duplicate parameter (already defined in URI) with conflicting values!"
			}
			continue
		}
		merged[k] = cloneValue(v)
	}
	if len(perr.Errors) > 0 {
		return nil, perr
	}
	return merged, nil
}

// check normalizes legacy formats and validates params in place.
func (m *Method) check(params Params) error {
	normalizeLegacy(params, m.Params)
	errs := map[string]string{}
	checkObject("", m.Params, params, errs)
	if len(errs) > 0 {
		return &ParamError{Errors: errs}
	}
	return nil
}

// normalizeLegacy mirrors PVE::RESTHandler's
// $normalize_legacy_param_formats: a form sends one value where the
// schema wants an array, or an array where it wants a "-list" string.
// Like Perl, it only touches values that are true ("" and "0" are not).
func normalizeLegacy(params Params, schema *Prop) {
	if schema == nil || schema.Properties == nil {
		return
	}
	for k, p := range schema.Properties {
		v, ok := params[k]
		if !ok || !perlTrue(v) {
			continue
		}
		arr, isArr := v.([]any)
		switch {
		case isArr && p.Type == "string" && strings.HasSuffix(p.Format, "-list"):
			parts := make([]string, len(arr))
			for i, e := range arr {
				parts[i] = fmt.Sprint(e)
			}
			params[k] = strings.Join(parts, ",")
		case !isArr && p.Type == "array":
			if _, isObj := v.(map[string]any); !isObj {
				params[k] = []any{v}
			}
		}
	}
}

func perlTrue(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case string:
		return t != "" && t != "0"
	case bool:
		return t
	}
	return true
}

// addError joins several messages for one path like PVE does.
func addError(errs map[string]string, path, msg string) {
	if path == "" {
		path = "_root"
	}
	if old, ok := errs[path]; ok {
		errs[path] = old + `\n` + msg
		return
	}
	errs[path] = msg
}

// checkObject is PVE::JSONSchema::check_object.
func checkObject(path string, schema *Prop, value map[string]any, errs map[string]string) {
	if schema == nil {
		return
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	for _, k := range sortedKeys(schema.Properties) {
		v, present := value[k]
		if !present {
			v = nil
		}
		checkProp(v, schema.Properties[k], join(k), errs)
	}
	additional := schema.AdditionalProperties
	for _, k := range sortedKeys(value) {
		if sub, ok := schema.Properties[k]; ok {
			if sub.Requires != "" {
				if _, has := value[sub.Requires]; !has {
					addError(errs, join(sub.Requires), fmt.Sprintf("missing property - '%s' requires this property", join(k)))
				}
			}
			continue
		}
		if additional != nil && !*additional {
			addError(errs, join(k), "property is not defined in schema and the schema does not allow additional properties")
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// checkProp is PVE::JSONSchema::check_prop for the keywords the API uses.
func checkProp(value any, schema *Prop, path string, errs map[string]string) {
	if schema == nil {
		return
	}
	if value == nil {
		if schema.Type == "null" {
			return
		}
		if !schema.Optional && schema.Alias == "" {
			addError(errs, path, "property is missing and it is not optional")
		}
		return
	}
	if !checkType(path, schema.Type, value, errs) {
		return
	}
	switch v := value.(type) {
	case []any:
		if schema.Items != nil {
			for i, el := range v {
				checkProp(el, schema.Items, fmt.Sprintf("%s[%d]", path, i), errs)
			}
		}
		return
	case map[string]any:
		if schema.Properties != nil || schema.AdditionalProperties != nil {
			checkObject(path, schema, v, errs)
		}
		return
	case bool:
		return // a JSON boolean that passed the type check
	}
	s := value.(string)
	if schema.Format != "" || schema.FormatObj != nil {
		if err := checkFormat(schema, s, path); err != nil {
			addError(errs, path, "invalid format - "+err.Error())
			return
		}
	}
	if schema.re != nil && !schema.re.MatchString(s) {
		addError(errs, path, "value does not match the regex pattern")
		return
	}
	if n := perlLength(s); schema.MaxLength >= 0 && n > schema.MaxLength {
		addError(errs, path, fmt.Sprintf("value may only be %d characters long", schema.MaxLength))
		return
	} else if schema.MinLength >= 0 && n < schema.MinLength {
		addError(errs, path, fmt.Sprintf("value must be at least %d characters long", schema.MinLength))
		return
	}
	if isNumber(s) {
		f, _ := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if schema.Maximum != "" {
			if max, err := strconv.ParseFloat(schema.Maximum, 64); err == nil && f > max {
				addError(errs, path, "value must have a maximum value of "+schema.Maximum)
				return
			}
		}
		if schema.Minimum != "" {
			if min, err := strconv.ParseFloat(schema.Minimum, 64); err == nil && f < min {
				addError(errs, path, "value must have a minimum value of "+schema.Minimum)
				return
			}
		}
	}
	if len(schema.Enum) > 0 {
		for _, e := range schema.Enum {
			if e == s {
				return
			}
		}
		addError(errs, path, fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", s, strings.Join(schema.Enum, ", ")))
	}
}

// perlLength is Perl's length() of a decoded string: characters.
func perlLength(s string) int { return len([]rune(s)) }

var (
	integerRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[+-]?\d+\n?$`) })
	numberRe  = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?\n?$`)
	})
)

func isNumber(s string) bool { return numberRe().MatchString(s) }

// refName is what Perl's ref() says of a decoded JSON value.
func refName(v any) string {
	switch v.(type) {
	case bool:
		return "JSON::PP::Boolean"
	case []any:
		return "ARRAY"
	case map[string]any:
		return "HASH"
	}
	return ""
}

// checkType is PVE::JSONSchema::check_type: booleans are 0 or 1 (or a
// JSON boolean), integers and numbers are checked by their text.
func checkType(path, typ string, value any, errs map[string]string) bool {
	switch typ {
	case "", "any":
		return true
	case "null":
		addError(errs, path, fmt.Sprintf("type check ('%s') failed - value is not null", typ))
		return false
	case "array":
		if _, ok := value.([]any); !ok {
			addError(errs, path, "type check ('array') failed")
			return false
		}
		return true
	case "object":
		if _, ok := value.(map[string]any); !ok {
			addError(errs, path, "type check ('object') failed")
			return false
		}
		return true
	}
	if ref := refName(value); ref != "" {
		if typ == "boolean" && ref == "JSON::PP::Boolean" {
			return true
		}
		addError(errs, path, fmt.Sprintf("type check ('%s') failed - got %s", typ, ref))
		return false
	}
	s, _ := value.(string)
	ok := true
	switch typ {
	case "boolean":
		ok = s == "1" || s == "0"
	case "integer":
		ok = integerRe().MatchString(s)
	case "number":
		ok = isNumber(s)
	}
	if !ok {
		addError(errs, path, fmt.Sprintf("type check ('%s') failed - got '%s'", typ, s))
	}
	return ok
}

// CheckReturns checks a response's data against the method's "returns"
// schema, the way PVE's (optional) result verification would. Data is
// the decoded JSON (json.Unmarshal into any). Tests use it to keep the
// simulator's answers in the schema's shapes.
func (m *Method) CheckReturns(data any) error {
	if m.Returns == nil {
		return nil
	}
	errs := map[string]string{}
	checkProp(jsonToParams(data), m.Returns, "", errs)
	if len(errs) > 0 {
		return fmt.Errorf("%s %s: result verification failed: %w", m.Method, m.Path, &ParamError{Errors: errs})
	}
	return nil
}

// jsonToParams turns decoded JSON (numbers as float64 or json.Number)
// into the Params value model: scalars as Perl would print them.
func jsonToParams(v any) any {
	switch t := v.(type) {
	case nil, bool, string:
		return t
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64)
	case interface{ String() string }: // json.Number
		return perlNumber(t.String())
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = jsonToParams(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = jsonToParams(e)
		}
		return out
	}
	return fmt.Sprint(v)
}

// perlNumber prints a JSON number the way Perl stringifies it: integers
// as written, others through the shortest float form (1e2 is "100").
func perlNumber(lit string) string {
	if integerRe().MatchString(lit) {
		return lit
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return lit
	}
	return strconv.FormatFloat(f, 'g', 15, 64)
}
