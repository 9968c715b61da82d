//go:build linux

package egress

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testnet"
)

// git, through the proxy variables and through the transparent listener,
// clones from an allowed host (git's smart HTTP protocol, served by
// git-http-backend: testnet's Site.GitRepo), and not from a denied one.
func TestGitThroughTheProxy(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("the test needs git: ", err)
	}
	f := newFixture(t, nil)
	const tok = "job-git"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	sb := newSandbox(t, f.p, tok)
	f.w.Sites["allowed"].GitRepo(t, "cloned through the egress proxy\n")

	gitEnv := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@test"}

	clientEnv := append([]string{"GIT_SSL_CAINFO=" + f.w.RootsPEM, "GIT_TERMINAL_PROMPT=0"}, gitEnv...)
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

// pip downloads a package from an index on an allowed host (testnet's
// Site.PackageIndex) through the proxy variables.
func TestPipThroughTheProxy(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed here; TestGitThroughTheProxy covers a package manager's client")
	}
	f := newFixture(t, nil)
	const tok = "job-pip"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test")})
	whl := f.w.Sites["allowed"].PackageIndex(t)
	dst := t.TempDir()
	start := time.Now()
	res := run(t, "", f.proxyEnv(tok), python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
		"--index-url", "https://allowed.test/simple/", "--cert", f.w.RootsPEM, "-d", dst, "tinypkg")
	if strings.Contains(res.err, "No module named pip") {
		t.Skip("pip is not installed here; TestGitThroughTheProxy covers a package manager's client")
	}
	if res.code != 0 {
		t.Fatalf("pip download: %v\nlog:\n%s", res, f.dump(tok))
	}
	t.Logf("pip took %s", time.Since(start))
	start = time.Now()
	if got, err := os.ReadFile(filepath.Join(dst, testnet.WheelFile)); err != nil || !bytes.Equal(got, whl) {
		t.Errorf("the wheel: %v", err)
	}
	f.entry(t, tok, "pip's CONNECT", named(ViaConnect, "allowed.test", true))
	res = run(t, "", f.proxyEnv(tok), python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--retries", "0",
		"--index-url", "https://denied.test/simple/", "--cert", f.w.RootsPEM, "-d", dst, "tinypkg")
	if res.code == 0 {
		t.Errorf("pip download from denied.test: %v", res)
	}
	t.Logf("pip (denied) took %s", time.Since(start))
}
