package egress

import (
	"fmt"
	"log/slog"
	"net/textproto"
	"strings"
)

// InjectSuffix marks a secret's injection binding: beside the secret NAME
// (DELEGATE_SECRET_NAME, or NAME= in DELEGATE_SECRETS_FILE), the operator
// writes NAME_INJECT='host Header Format {}', for instance
//
//	DELEGATE_SECRET_GITHUB_TOKEN_INJECT='api.github.com Authorization Bearer {}'
//
// and the proxy adds "Authorization: Bearer <the secret>" to the job's
// HTTPS requests to api.github.com, which never hold the secret themselves.
const InjectSuffix = "_INJECT"

// InjectTarget returns the secret a key binds: "GITHUB_TOKEN" for
// "GITHUB_TOKEN_INJECT". The same key works in the environment (after the
// DELEGATE_SECRET_ prefix) and in the secrets file.
func InjectTarget(key string) (string, bool) {
	name, ok := strings.CutSuffix(key, InjectSuffix)
	if !ok || name == "" {
		return "", false
	}
	return name, true
}

// Binding is an operator's NAME_INJECT line: where a secret goes.
type Binding struct {
	Secret string // the secret's name, e.g. GITHUB_TOKEN
	Host   string // the one host it is sent to, e.g. api.github.com
	Header string // canonical header name, e.g. Authorization
	Format string // the header's value, "{}" standing for the secret
}

// InjectError says what is wrong with a NAME_INJECT line. It never holds a
// secret: a binding holds none.
type InjectError struct {
	Key    string // NAME_INJECT
	Field  string // host, header or format
	Reason string
}

func (e *InjectError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", e.Key, e.Field, e.Reason)
}

func (e *InjectError) Unwrap() error { return ErrInvalid }

// hopHeaders are the headers a proxy owns (framing, connection, the proxy
// itself): a secret may not be bound to them.
var hopHeaders = []string{
	"Connection", "Content-Length", "Host", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// ParseBinding reads the value of secret's NAME_INJECT line:
// "host Header Format {}". The value may be wrapped in one pair of single
// or double quotes, so that the same line works in a shell's environment
// and in the secrets file (which keeps quotes as they are).
func ParseBinding(secret, value string) (Binding, error) {
	key := secret + InjectSuffix
	fail := func(field, format string, args ...any) (Binding, error) {
		return Binding{}, &InjectError{Key: key, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if secret == "" {
		return fail("", "the secret's name is empty")
	}
	v := strings.TrimSpace(value)
	if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') && v[len(v)-1] == v[0] {
		v = strings.TrimSpace(v[1 : len(v)-1])
	}
	for _, c := range v {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return fail("", "control character %q: the value is one line, \"host Header Format {}\"", c)
		}
	}
	host, rest, _ := strings.Cut(v, " ")
	rest = strings.TrimLeft(rest, " \t")
	header, format, _ := strings.Cut(rest, " ")
	format = strings.TrimSpace(format)
	if host == "" || header == "" || format == "" {
		return fail("", `must be "host Header Format {}", for instance "api.github.com Authorization Bearer {}"`)
	}
	if strings.Contains(host, "*") {
		return fail("host", "%q: one host name, no wildcard: the job's CA is constrained to exactly the hosts credentials go to", host)
	}
	if strings.Contains(host, ":") || strings.Contains(host, "/") {
		return fail("host", "%q: a host name alone (no scheme, port or path): credentials go over HTTPS", host)
	}
	name, reason := normalizeName(host)
	if reason != "" {
		return fail("host", "%q: %s", host, reason)
	}
	if !validHeaderName(header) {
		return fail("header", "%q is not an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~)", header)
	}
	canon := textproto.CanonicalMIMEHeaderKey(header)
	for _, h := range hopHeaders {
		if canon == h {
			return fail("header", "%s belongs to the connection or the proxy, not to a credential", canon)
		}
	}
	if n := strings.Count(format, "{}"); n != 1 {
		return fail("format", "must hold {} exactly once, where the secret goes (it holds it %d times)", n)
	}
	return Binding{Secret: secret, Host: name, Header: canon, Format: format}, nil
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// String shows the binding as the operator wrote it (no secret in it).
func (b Binding) String() string {
	return b.Host + " " + b.Header + " " + b.Format
}

// Injection is a binding with its secret: the header the proxy sets on the
// job's requests to Host. Its value prints as "[secret]" whatever the
// formatting, slog or %#v, so that it cannot reach a log by accident.
type Injection struct {
	Binding
	value secretValue // the header's whole value
}

// Inject binds the secret's value. The error names the secret, never its
// value.
func (b Binding) Inject(value string) (Injection, error) {
	if value == "" {
		return Injection{}, &InjectError{Key: b.Secret, Reason: "the secret is empty"}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return Injection{}, &InjectError{Key: b.Secret, Reason: "the secret holds a control character and cannot go in an HTTP header"}
		}
	}
	return Injection{Binding: b, value: secretValue(strings.Replace(b.Format, "{}", value, 1))}, nil
}

// GoString keeps %#v (which prints unexported fields by reflection, past
// secretValue's own methods) from showing the secret.
func (in Injection) GoString() string {
	return fmt.Sprintf("egress.Injection{Binding:%#v, value:[secret]}", in.Binding)
}

// secretValue hides itself from every printer.
type secretValue string

func (secretValue) String() string               { return "[secret]" }
func (secretValue) GoString() string             { return "[secret]" }
func (secretValue) LogValue() slog.Value         { return slog.StringValue("[secret]") }
func (secretValue) MarshalText() ([]byte, error) { return []byte("[secret]"), nil }
func (s secretValue) Format(f fmt.State, _ rune) {
	_, _ = f.Write([]byte("[secret]"))
}
