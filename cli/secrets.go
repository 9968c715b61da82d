package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
)

// openPrivate opens the file a setting names, if only its owner can read
// it, as a key file must be.
func openPrivate(setting, path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("%s=%s: mode %04o lets others read it: chmod 600 %s", setting, path, fi.Mode().Perm(), path)
	}
	return f, nil
}

// loadSecrets reads DELEGATE_SECRETS_FILE: NAME=value lines, # comments.
func loadSecrets(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	f, err := openPrivate("DELEGATE_SECRETS_FILE", path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	secrets := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, value, ok := strings.Cut(string(line), "=")
		name = strings.TrimSpace(name)
		if !ok || !delegate.ValidName(name) {
			// The line itself is not shown: it may hold a secret.
			return nil, fmt.Errorf("DELEGATE_SECRETS_FILE=%s line %d: must be NAME=value with NAME like API_KEY", path, n)
		}
		secrets[name] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("DELEGATE_SECRETS_FILE: %w", err)
	}
	return secrets, nil
}

// SecretResolver loads DELEGATE_SECRETS_FILE and returns what resolves a
// job's secret names on the server.
func (c Config) SecretResolver() (func(string) (string, bool), error) {
	file, err := loadSecrets(c.SecretsFile)
	if err != nil {
		return nil, err
	}
	return secretResolver(file), nil
}

// secretResolver looks a secret up in DELEGATE_SECRET_<NAME>, then in the
// secrets file. A NAME_INJECT binding is not a secret a job may name.
func secretResolver(file map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if _, ok := egress.InjectTarget(name); ok {
			return "", false
		}
		if v, ok := os.LookupEnv("DELEGATE_SECRET_" + name); ok {
			return v, true
		}
		v, ok := file[name]
		return v, ok
	}
}

// LoadHTTPToken returns the token the HTTP server requires:
// DELEGATE_HTTP_TOKEN, or the content of DELEGATE_HTTP_TOKEN_FILE (its
// surrounding white space trimmed); "" when neither is set.
func (c Config) LoadHTTPToken() (string, error) {
	if c.HTTPTokenFile == "" {
		return c.HTTPToken, nil
	}
	f, err := openPrivate("DELEGATE_HTTP_TOKEN_FILE", c.HTTPTokenFile)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10))
	if err != nil {
		return "", fmt.Errorf("DELEGATE_HTTP_TOKEN_FILE: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("DELEGATE_HTTP_TOKEN_FILE=%s: the file is empty", c.HTTPTokenFile)
	}
	return token, nil
}

// SecretBindings reads the operator's injection bindings, by secret:
// DELEGATE_SECRET_<NAME>_INJECT='host Header Format {}' in the
// environment, and NAME_INJECT=... lines of DELEGATE_SECRETS_FILE (the
// environment wins, as for the secrets). A bound secret is never put in a
// job's environment: delegate's egress proxy adds it to the job's HTTPS
// requests for that host. A bad binding, or one whose secret is not set,
// is an error naming its key and the field at fault.
func (c Config) SecretBindings() (map[string]egress.Binding, error) {
	file, err := loadSecrets(c.SecretsFile)
	if err != nil {
		return nil, err
	}
	return secretBindings(os.Environ(), file)
}

func secretBindings(environ []string, file map[string]string) (map[string]egress.Binding, error) {
	resolve := secretResolver(file)
	out := map[string]egress.Binding{}
	add := func(where, key, value string) error {
		name, ok := egress.InjectTarget(key)
		if !ok {
			return nil
		}
		if _, done := out[name]; done {
			return nil
		}
		b, err := egress.ParseBinding(name, value)
		if err != nil {
			return fmt.Errorf("%s%w", where, err)
		}
		if _, ok := resolve(name); !ok {
			return fmt.Errorf("%s%s%s binds the secret %s, which is not set (DELEGATE_SECRET_%s or %s= in DELEGATE_SECRETS_FILE)", where, name, egress.InjectSuffix, name, name, name)
		}
		out[name] = b
		return nil
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if key, ok := strings.CutPrefix(k, "DELEGATE_SECRET_"); ok {
			if err := add("DELEGATE_SECRET_", key, v); err != nil {
				return nil, err
			}
		}
	}
	for k, v := range file {
		if err := add("DELEGATE_SECRETS_FILE: ", k, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}
