//go:build linux

package testnet

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
)

// WheelFile is the file name of the package PackageIndex serves.
const WheelFile = "tinypkg-1.0-py3-none-any.whl"

// PackageIndex serves a PEP 503 index of one package, tinypkg, under
// /simple/ and its wheel under /packages/ on the site, as pip reads them.
func (s *Site) PackageIndex(t testing.TB) []byte {
	t.Helper()
	whl := wheel(t)
	sum := sha256.Sum256(whl)
	s.Route(t, "/simple/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<html><body><a href="/packages/%s#sha256=%s">%s</a></body></html>`, WheelFile, hex.EncodeToString(sum[:]), WheelFile)
	}))
	s.Route(t, "/packages/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(whl) }))
	return whl
}

// wheel builds the smallest valid wheel of a package tinypkg.
func wheel(t testing.TB) []byte {
	files := []struct{ name, body string }{
		{"tinypkg/__init__.py", "VALUE = 42\n"},
		{"tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"},
		{"tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: testnet\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("tinypkg-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("tinypkg-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// GitRepo serves a bare repository, /git/repo.git, whose one commit has a
// README holding readme, over git's smart HTTP protocol (git
// http-backend) on the site.
func (s *Site) GitRepo(t testing.TB, readme string) {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("the test needs git: ", err)
	}
	root := t.TempDir()
	env := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@test")
	work := filepath.Join(root, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "README"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", work},
		{"-C", work, "add", "README"},
		{"-C", work, "commit", "-q", "-m", "first"},
		{"clone", "-q", "--bare", work, filepath.Join(root, "repo.git")},
	} {
		cmd := exec.Command(git, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	s.Route(t, "/git/", &cgi.Handler{Path: git, Args: []string{"http-backend"}, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}})
}
