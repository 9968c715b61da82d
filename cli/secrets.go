package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/delegate-dev/delegate"
)

// loadSecrets reads DELEGATE_SECRETS_FILE: NAME=value lines, # comments.
// The file must be readable by its owner only, as a key file would be.
func loadSecrets(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("DELEGATE_SECRETS_FILE: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("DELEGATE_SECRETS_FILE: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("DELEGATE_SECRETS_FILE=%s: mode %04o lets others read it: chmod 600 %s", path, fi.Mode().Perm(), path)
	}
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
// secrets file.
func secretResolver(file map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if v, ok := os.LookupEnv("DELEGATE_SECRET_" + name); ok {
			return v, true
		}
		v, ok := file[name]
		return v, ok
	}
}
