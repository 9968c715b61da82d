package cli

import (
	"strings"
	"testing"
)

// TestSecretBindings: NAME_INJECT lines are read from the environment and
// the secrets file; a bad one, or one whose secret is not set, stops the
// server with its key and the field at fault, and never a secret's value.
func TestSecretBindings(t *testing.T) {
	file := map[string]string{"FILE_TOKEN": "s3cr3t-file", "FILE_TOKEN_INJECT": "'api.example.com Authorization Bearer {}'"}
	tests := []struct {
		name    string
		env     []string
		file    map[string]string
		want    map[string]string // secret → binding
		wantErr string
	}{
		{"none", nil, nil, map[string]string{}, ""},
		{"env", []string{"DELEGATE_SECRET_GH=s3cr3t", "DELEGATE_SECRET_GH_INJECT=api.github.com Authorization Bearer {}"}, nil,
			map[string]string{"GH": "api.github.com Authorization Bearer {}"}, ""},
		{"file", nil, file, map[string]string{"FILE_TOKEN": "api.example.com Authorization Bearer {}"}, ""},
		{"env wins", []string{"DELEGATE_SECRET_FILE_TOKEN_INJECT=other.example.com X-Key {}"}, file,
			map[string]string{"FILE_TOKEN": "other.example.com X-Key {}"}, ""},
		{"bad host", []string{"DELEGATE_SECRET_GH=s3cr3t", "DELEGATE_SECRET_GH_INJECT=*.github.com Authorization {}"}, nil, nil,
			"DELEGATE_SECRET_GH_INJECT: host"},
		{"hop header", []string{"DELEGATE_SECRET_GH=s3cr3t", "DELEGATE_SECRET_GH_INJECT=api.github.com Host {}"}, nil, nil,
			"DELEGATE_SECRET_GH_INJECT: header"},
		{"no placeholder", nil, map[string]string{"T": "s3cr3t", "T_INJECT": "a.example Authorization Bearer"}, nil,
			"DELEGATE_SECRETS_FILE: T_INJECT: format"},
		{"secret not set", []string{"DELEGATE_SECRET_NOPE_INJECT=a.example X-Key {}"}, nil, nil,
			"NOPE_INJECT binds the secret NOPE, which is not set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			got, err := secretBindings(tc.env, tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Fatalf("the error shows a secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k].String() != v {
					t.Errorf("%s: %q, want %q", k, got[k].String(), v)
				}
			}
		})
	}
	// A binding is not a secret a job may ask for.
	if _, ok := secretResolver(file)("FILE_TOKEN_INJECT"); ok {
		t.Error("a job could read FILE_TOKEN_INJECT as a secret")
	}
}
