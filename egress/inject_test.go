package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestParseBinding(t *testing.T) {
	tests := []struct {
		value   string
		want    Binding
		wantErr string
	}{
		{value: "api.github.com Authorization Bearer {}",
			want: Binding{Secret: "GITHUB_TOKEN", Host: "api.github.com", Header: "Authorization", Format: "Bearer {}"}},
		// The shell's quotes, kept by the secrets file, are taken off.
		{value: "'api.github.com Authorization Bearer {}'",
			want: Binding{Secret: "GITHUB_TOKEN", Host: "api.github.com", Header: "Authorization", Format: "Bearer {}"}},
		{value: `"API.GitHub.com.  x-api-key   {}"`,
			want: Binding{Secret: "GITHUB_TOKEN", Host: "api.github.com", Header: "X-Api-Key", Format: "{}"}},
		{value: "api.test Authorization token {} extra words",
			want: Binding{Secret: "GITHUB_TOKEN", Host: "api.test", Header: "Authorization", Format: "token {} extra words"}},
		{value: "", wantErr: `GITHUB_TOKEN_INJECT: must be "host Header Format {}"`},
		{value: "api.github.com Authorization", wantErr: `must be "host Header Format {}"`},
		{value: "'api.github.com Authorization Bearer {}", wantErr: "GITHUB_TOKEN_INJECT: host: \"'api.github.com\""},
		{value: "*.github.com Authorization Bearer {}", wantErr: "host: \"*.github.com\": one host name, no wildcard"},
		{value: "https://api.github.com Authorization Bearer {}", wantErr: "host: \"https://api.github.com\": a host name alone"},
		{value: "api.github.com:443 Authorization Bearer {}", wantErr: "a host name alone"},
		{value: "api.github.com Author(ization Bearer {}", wantErr: "header: \"Author(ization\" is not an HTTP header name"},
		{value: "api.github.com Host {}", wantErr: "header: Host belongs to the connection"},
		{value: "api.github.com proxy-authorization {}", wantErr: "header: Proxy-Authorization belongs"},
		{value: "api.github.com Authorization Bearer", wantErr: "format: must hold {} exactly once"},
		{value: "api.github.com Authorization {}{}", wantErr: "format: must hold {} exactly once, where the secret goes (it holds it 2 times)"},
		{value: "api.github.com Authorization Bearer {}\r\nX: y", wantErr: "control character"},
	}
	for _, tt := range tests {
		got, err := ParseBinding("GITHUB_TOKEN", tt.value)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseBinding(%q) = %+v, %v; want an error with %q", tt.value, got, err, tt.wantErr)
			}
			var ie *InjectError
			if err != nil && (!errors.As(err, &ie) || !errors.Is(err, ErrInvalid)) {
				t.Errorf("ParseBinding(%q): %T is not an *InjectError wrapping ErrInvalid", tt.value, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseBinding(%q) = %+v, %v; want %+v", tt.value, got, err, tt.want)
		}
	}
}

func TestInjectTarget(t *testing.T) {
	for key, want := range map[string]string{"GITHUB_TOKEN_INJECT": "GITHUB_TOKEN", "_INJECT": "", "GITHUB_TOKEN": "", "X_INJECT_INJECT": "X_INJECT"} {
		got, ok := InjectTarget(key)
		if got != want || ok != (want != "") {
			t.Errorf("InjectTarget(%q) = %q %v, want %q", key, got, ok, want)
		}
	}
}

// The secret's value shows in no printing of an Injection, nor in errors.
func TestInjectionNeverPrintsTheSecret(t *testing.T) {
	const secret = "ghp_s3cretvalue"
	b := mustBinding(t, "GITHUB_TOKEN", "api.github.com Authorization Bearer {}")
	in, err := b.Inject(secret)
	if err != nil {
		t.Fatal(err)
	}
	if string(in.value) != "Bearer "+secret {
		t.Fatalf("header value %q", string(in.value))
	}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "inj", in, "v", in.value)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "inj", in, "v", in.value)
	js, _ := json.Marshal(in)
	pol := Policy{Mode: Egress, Inject: []Injection{in}}
	for _, s := range []string{
		fmt.Sprint(in), fmt.Sprintf("%v %+v %#v %s %q %x", in, in, in, in.value, in.value, in.value),
		fmt.Sprintf("%+v %#v", pol, pol), logged.String(), string(js),
	} {
		if strings.Contains(s, "s3cret") || strings.Contains(s, "73336372") {
			t.Errorf("the secret shows: %s", s)
		}
	}
	for _, bad := range []string{"a\r\nX-Evil: 1", "nul\x00"} {
		_, err := b.Inject(bad)
		if err == nil || strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "GITHUB_TOKEN") {
			t.Errorf("Inject(%q): %v", bad, err)
		}
	}
}

func mustBinding(t testing.TB, secret, value string) Binding {
	t.Helper()
	b, err := ParseBinding(secret, value)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
