//go:build linux

package egress

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// git, through the proxy variables and through the transparent listener,
// clones from an allowed host (git's smart HTTP protocol, served by
// git-http-backend), and not from a denied one.
func TestGitThroughTheProxy(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("the test needs git: ", err)
	}
	f := newFixture(t, nil)
	const tok = "job-git"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	sb := newSandbox(t, f.p, tok)

	root := t.TempDir()
	gitEnv := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@test"}
	work := filepath.Join(root, "work")
	must(t, os.MkdirAll(work, 0o755))
	must(t, os.WriteFile(filepath.Join(work, "README"), []byte("cloned through the egress proxy\n"), 0o644))
	for _, args := range [][]string{
		{git, "init", "-q", "-b", "main", work},
		{git, "-C", work, "add", "README"},
		{git, "-C", work, "commit", "-q", "-m", "first"},
		{git, "clone", "-q", "--bare", work, filepath.Join(root, "repo.git")},
	} {
		if res := run(t, "", gitEnv, args...); res.code != 0 {
			t.Fatalf("%v: %v", args, res)
		}
	}
	f.w.sites["allowed"].route(t, "/git/", &cgi.Handler{Path: git, Args: []string{"http-backend"}, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}})

	clientEnv := append([]string{"GIT_SSL_CAINFO=" + f.w.rootsPEM, "GIT_TERMINAL_PROMPT=0"}, gitEnv...)
	for _, tc := range []struct {
		name, ns string
		env      []string
	}{
		{"proxy variables", "", f.proxyEnv(tok)},
		{"transparent", sb.ns, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "clone")
			res := run(t, tc.ns, append(tc.env, clientEnv...), git, "clone", "-q", "https://allowed.test/git/repo.git", dst)
			if res.code != 0 {
				t.Fatalf("git clone: %v\nlog:\n%s", res, f.dump(tok))
			}
			b, err := os.ReadFile(filepath.Join(dst, "README"))
			if err != nil || string(b) != "cloned through the egress proxy\n" {
				t.Errorf("README: %q %v", b, err)
			}
		})
	}
	res := run(t, "", append(f.proxyEnv(tok), clientEnv...), git, "clone", "-q", "https://denied.test/git/repo.git", filepath.Join(t.TempDir(), "no"))
	if res.code == 0 || !strings.Contains(res.err, "403") {
		t.Errorf("git clone from denied.test: %v", res)
	}
}

// pip downloads a package from an index on an allowed host through the
// proxy variables.
func TestPipThroughTheProxy(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed here; TestGitThroughTheProxy covers a package manager's client")
	}
	f := newFixture(t, nil)
	const tok = "job-pip"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	whl := wheel(t)
	sum := sha256.Sum256(whl)
	const file = "tinypkg-1.0-py3-none-any.whl"
	f.w.sites["allowed"].route(t, "/simple/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<html><body><a href="/packages/%s#sha256=%s">%s</a></body></html>`, file, hex.EncodeToString(sum[:]), file)
	}))
	f.w.sites["allowed"].route(t, "/packages/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(whl)
	}))
	dst := t.TempDir()
	start := time.Now()
	res := run(t, "", f.proxyEnv(tok), python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
		"--index-url", "https://allowed.test/simple/", "--cert", f.w.rootsPEM, "-d", dst, "tinypkg")
	if strings.Contains(res.err, "No module named pip") {
		t.Skip("pip is not installed here; TestGitThroughTheProxy covers a package manager's client")
	}
	if res.code != 0 {
		t.Fatalf("pip download: %v\nlog:\n%s", res, f.dump(tok))
	}
	t.Logf("pip took %s", time.Since(start))
	start = time.Now()
	if got, err := os.ReadFile(filepath.Join(dst, file)); err != nil || !bytes.Equal(got, whl) {
		t.Errorf("the wheel: %v", err)
	}
	f.entry(t, tok, "pip's CONNECT", named(ViaConnect, "allowed.test", true))
	res = run(t, "", f.proxyEnv(tok), python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--retries", "0",
		"--index-url", "https://denied.test/simple/", "--cert", f.w.rootsPEM, "-d", dst, "tinypkg")
	if res.code == 0 {
		t.Errorf("pip download from denied.test: %v", res)
	}
	t.Logf("pip (denied) took %s", time.Since(start))
}

// wheel builds the smallest valid wheel of a package "tinypkg".
func wheel(t *testing.T) []byte {
	files := []struct{ name, body string }{
		{"tinypkg/__init__.py", "VALUE = 42\n"},
		{"tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"},
		{"tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: egress-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.Create(f.name)
		must(t, err)
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("tinypkg-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("tinypkg-1.0.dist-info/RECORD")
	must(t, err)
	w.Write([]byte(record.String()))
	must(t, zw.Close())
	return buf.Bytes()
}
