package workspace

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// gitServer serves the repositories under root over https on loopback
// with Debian's git-http-backend (in the test only; the package runs no
// git binary). It records the Authorization headers it receives; with
// auth set it demands one.
type gitServer struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
	auth  bool
}

func newGitServer(t *testing.T, root string) *gitServer {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		t.Skip("git-http-backend is not installed (apt-get install git)")
	}
	gs := &gitServer{}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + root},
		Stderr: io.Discard, Logger: log.New(io.Discard, "", 0)}
	gs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gs.mu.Lock()
		if a := r.Header.Get("Authorization"); a != "" {
			gs.auths = append(gs.auths, a)
		}
		gs.mu.Unlock()
		if gs.auth {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	gs.Config.ErrorLog = log.New(io.Discard, "", 0)
	gs.StartTLS()
	t.Cleanup(gs.Close)
	return gs
}

func (gs *gitServer) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(gs.Certificate())
	return p
}

// loopbackDial is a permissive policy, for tests only.
func loopbackDial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// servedRepo makes a repository with two branches, tags, history and a
// submodule entry, published bare under root/repo.git; it returns the
// work repository (for the test to ask git about) and the commits.
func servedRepo(t *testing.T, root string) (work string, commits map[string]string) {
	t.Helper()
	work = newRepo(t, map[string]string{"README": "v1\n", "src/main.go": "package main\n", "tool.sh": "#!/bin/sh\n", "link": "->README"})
	os.Chmod(filepath.Join(work, "tool.sh"), 0o755)
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", "exec")
	commits = map[string]string{"old": strings.TrimSpace(git(t, work, "rev-parse", "HEAD~1"))}
	git(t, work, "tag", "-a", "v1", "-m", "release 1")
	writeFiles(t, work, map[string]string{"README": "v2\n"})
	// A submodule entry: a gitlink, which Clone leaves an empty directory.
	git(t, work, "update-index", "--add", "--cacheinfo", "160000,"+commits["old"]+",vendor/sub")
	git(t, work, "add", "README")
	git(t, work, "commit", "-qm", "v2") // not -a: it would drop the gitlink, absent from the work tree
	git(t, work, "tag", "light")
	commits["main"] = strings.TrimSpace(git(t, work, "rev-parse", "HEAD"))
	commits["v1"] = strings.TrimSpace(git(t, work, "rev-parse", "v1^{commit}"))
	git(t, work, "checkout", "-q", "-b", "dev", "v1")
	writeFiles(t, work, map[string]string{"dev.txt": "dev\n"})
	git(t, work, "add", "-A")
	git(t, work, "commit", "-qm", "dev")
	commits["dev"] = strings.TrimSpace(git(t, work, "rev-parse", "HEAD"))
	git(t, work, "checkout", "-q", "main")
	git(t, root, "clone", "-q", "--bare", work, "repo.git")
	return work, commits
}

func TestCloneRefs(t *testing.T) {
	root := t.TempDir()
	_, commits := servedRepo(t, root)
	gs := newGitServer(t, root)
	// The server's own settings must not reach the clone: a proxy that
	// does not exist, credentials in netrc and git's credential store.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:9")
	t.Setenv("https_proxy", "http://127.0.0.1:9")
	host := strings.TrimPrefix(gs.URL, "https://")
	os.WriteFile(filepath.Join(home, ".netrc"), []byte("machine 127.0.0.1 login server password secret\n"), 0o600)
	os.WriteFile(filepath.Join(home, ".git-credentials"), []byte("https://server:secret@"+host+"\n"), 0o600)
	os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[credential]\n\thelper = store\n"), 0o600)

	for _, tc := range []struct {
		name, ref            string
		commit, ref2, branch string
		shallow              bool
		files                []string
	}{
		{"the default branch", "", commits["main"], "refs/heads/main", "main", true, []string{"README", "link", "src/main.go", "tool.sh"}},
		{"a branch", "dev", commits["dev"], "refs/heads/dev", "dev", true, []string{"README", "dev.txt", "link", "src/main.go", "tool.sh"}},
		{"an annotated tag", "v1", commits["v1"], "refs/tags/v1", "", true, nil},
		{"a lightweight tag", "light", commits["main"], "refs/tags/light", "", true, nil},
		{"a full ref name", "refs/heads/dev", commits["dev"], "refs/heads/dev", "dev", true, nil},
		{"a commit a ref names", commits["dev"], commits["dev"], "", "", true, nil},
		// Over http, upload-pack serves a commit its refs reach.
		{"a commit no ref names", commits["old"], commits["old"], "", "", true, []string{"README", "link", "src/main.go", "tool.sh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			res, err := Clone(context.Background(), CloneOptions{URL: gs.URL + "/repo.git", Ref: tc.ref, Dir: dir, Dial: loopbackDial, RootCAs: gs.pool()})
			if err != nil {
				t.Fatal(err)
			}
			if res.Commit != tc.commit || res.Ref != tc.ref2 || res.Branch != tc.branch || res.Shallow != tc.shallow {
				t.Errorf("got %+v, want commit %s ref %q branch %q shallow %v", res, tc.commit, tc.ref2, tc.branch, tc.shallow)
			}
			// git itself finds a clean work tree at that commit.
			if got := strings.TrimSpace(git(t, dir, "rev-parse", "HEAD")); got != tc.commit {
				t.Errorf("HEAD is %s", got)
			}
			if st := git(t, dir, "status", "--porcelain"); st != "" {
				t.Errorf("git status in the clone:\n%s", st)
			}
			if tc.branch != "" {
				if b := strings.TrimSpace(git(t, dir, "symbolic-ref", "--short", "HEAD")); b != tc.branch {
					t.Errorf("on branch %q", b)
				}
			}
			if tc.files != nil {
				got := lines(git(t, dir, "ls-files"))
				want := tc.files
				if tc.commit == commits["main"] {
					want = append([]string{}, tc.files...)
					want = append(want, "vendor/sub")
				}
				if strings.Join(got, " ") != strings.Join(lines(strings.Join(want, "\n")), " ") {
					t.Errorf("ls-files %q, want %q", got, want)
				}
			}
			if tc.commit == commits["main"] {
				if fi, err := os.Stat(filepath.Join(dir, "vendor/sub")); err != nil || !fi.IsDir() {
					t.Errorf("the submodule: %v", err)
				} else if names, _ := os.ReadDir(filepath.Join(dir, "vendor/sub")); len(names) != 0 {
					t.Errorf("the submodule was fetched: %v", names)
				}
			}
			if tc.shallow {
				if n := strings.TrimSpace(git(t, dir, "rev-list", "--count", "HEAD")); n != "1" {
					t.Errorf("%s commits fetched, want 1", n)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, ".git/hooks")); err == nil {
				if hooks, _ := os.ReadDir(filepath.Join(dir, ".git/hooks")); len(hooks) > 0 {
					t.Errorf("hooks in the clone: %v", hooks)
				}
			}
			// And the tree it made is one Scan takes as git's.
			tr, err := Scan(context.Background(), dir, ScanOptions{})
			if err != nil || tr.Kind != KindGit || tr.Head != tc.commit {
				t.Errorf("scan: %v %v %s", err, tr.Kind, tr.Head)
			}
		})
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if len(gs.auths) > 0 {
		t.Errorf("credentials were sent: %q", gs.auths)
	}
}

func TestCloneRefused(t *testing.T) {
	root := t.TempDir()
	servedRepo(t, root)
	gs := newGitServer(t, root)
	url := gs.URL + "/repo.git"
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	for _, tc := range []struct {
		name string
		opts CloneOptions
		want error
		text string
	}{
		{"loopback, by the default policy", CloneOptions{URL: url, RootCAs: gs.pool()}, ErrAddressRefused, "is loopback"},
		{"an unknown branch", CloneOptions{URL: url, Ref: "nope", Dial: loopbackDial, RootCAs: gs.pool()}, ErrUnknownRef, `no branch or tag "nope"`},
		{"an abbreviated commit", CloneOptions{URL: url, Ref: "abcdef1", Dial: loopbackDial, RootCAs: gs.pool()}, ErrUnknownRef, "full 40-character id"},
		{"a commit that is not there", CloneOptions{URL: url, Ref: strings.Repeat("ab", 20), Dial: loopbackDial, RootCAs: gs.pool()}, ErrUnknownRef, "is not in"},
		{"http", CloneOptions{URL: strings.Replace(url, "https:", "http:", 1), Dial: loopbackDial}, ErrBadURL, "only https"},
		{"ssh", CloneOptions{URL: "ssh://git@example.com/x.git"}, ErrBadURL, "only https"},
		{"scp-like", CloneOptions{URL: "git@example.com:x.git"}, ErrBadURL, ""},
		{"file", CloneOptions{URL: "file:///etc"}, ErrBadURL, "only https"},
		{"credentials in the URL", CloneOptions{URL: "https://user:pw@example.com/x.git"}, ErrBadURL, "credentials"},
		{"over the cap", CloneOptions{URL: url, Dial: loopbackDial, RootCAs: gs.pool(), MaxBytes: 100}, ErrOverCap, ""},
		{"an untrusted certificate", CloneOptions{URL: url, Dial: loopbackDial}, nil, "certificate"},
		{"a directory that is not empty", CloneOptions{URL: url, Dir: full, Dial: loopbackDial, RootCAs: gs.pool()}, nil, "not an empty directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.Dir == "" {
				tc.opts.Dir = t.TempDir()
			}
			_, err := Clone(context.Background(), tc.opts)
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err %v, want %v (%q)", err, tc.want, tc.text)
			}
		})
	}
	// A server that asks for credentials gets none.
	gs.auth = true
	_, err := Clone(context.Background(), CloneOptions{URL: url, Dir: t.TempDir(), Dial: loopbackDial, RootCAs: gs.pool()})
	if err == nil || !strings.Contains(err.Error(), "authentication required") {
		t.Errorf("err %v, want authentication required", err)
	}
	if len(gs.auths) > 0 {
		t.Errorf("credentials were sent: %q", gs.auths)
	}
}

// Clone writes as the directory's owner.
func TestCloneAsOwner(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	servedRepo(t, root)
	gs := newGitServer(t, root)
	dir := filepath.Join(t.TempDir(), "clone")
	os.Mkdir(dir, 0o755)
	os.Chown(dir, 4242, 4242) // the directories above are root's alone (0700)
	if _, err := Clone(context.Background(), CloneOptions{URL: gs.URL + "/repo.git", Dir: dir, Dial: loopbackDial, RootCAs: gs.pool()}); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		fi, _ := os.Lstat(p)
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 4242 {
			t.Errorf("%s belongs to uid %d", p, uid)
		}
		return nil
	})
}

func TestCheckAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"8.8.8.8", true}, {"1.1.1.1", true}, {"2606:4700:4700::1111", true}, {"140.82.112.3", true},
		{"127.0.0.1", false}, {"127.1.2.3", false}, {"::1", false}, {"0.0.0.0", false}, {"::", false},
		{"10.1.2.3", false}, {"172.16.0.1", false}, {"172.31.255.255", false}, {"192.168.1.1", false},
		{"169.254.169.254", false}, {"fe80::1", false}, {"fc00::1", false}, {"fd12:3456::1", false},
		{"100.64.0.1", false}, {"224.0.0.1", false}, {"255.255.255.255", false}, {"ff02::1", false},
		{"::ffff:127.0.0.1", false}, {"::ffff:10.0.0.1", false}, {"64:ff9b::a00:1", false}, {"2002:c0a8:101::1", false},
		{"64:ff9b::808:808", true}, {"192.0.2.1", false}, {"198.18.0.1", false},
	} {
		err := CheckAddress(netip.MustParseAddr(tc.addr))
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrAddressRefused) {
			t.Errorf("%s: %v, want allowed %v", tc.addr, err, tc.ok)
		}
	}
	// This host's own addresses, whatever they are.
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ip, _ := netip.AddrFromSlice(n.IP)
			if err := CheckAddress(ip.Unmap()); err == nil {
				t.Errorf("this host's %s allowed", ip)
			}
		}
	}
}

// CheckRef resolves a ref from the advertisement alone.
func TestCheckRef(t *testing.T) {
	root := t.TempDir()
	_, commits := servedRepo(t, root)
	gs := newGitServer(t, root)
	for _, tc := range []struct{ ref, commit, name string }{
		{"", commits["main"], "refs/heads/main"},
		{"dev", commits["dev"], "refs/heads/dev"},
		{"v1", commits["v1"], "refs/tags/v1"}, // the annotated tag's commit
		{commits["old"], commits["old"], ""},
	} {
		commit, name, err := CheckRef(context.Background(), CloneOptions{URL: gs.URL + "/repo.git", Ref: tc.ref, Dial: loopbackDial, RootCAs: gs.pool()})
		if err != nil || commit != tc.commit || name != tc.name {
			t.Errorf("%q: %s %s %v, want %s %s", tc.ref, commit, name, err, tc.commit, tc.name)
		}
	}
	if _, _, err := CheckRef(context.Background(), CloneOptions{URL: gs.URL + "/repo.git", Ref: "nope", Dial: loopbackDial, RootCAs: gs.pool()}); !errors.Is(err, ErrUnknownRef) {
		t.Errorf("an unknown ref: %v", err)
	}
	if _, _, err := CheckRef(context.Background(), CloneOptions{URL: gs.URL + "/repo.git", RootCAs: gs.pool()}); !errors.Is(err, ErrAddressRefused) {
		t.Errorf("loopback by default: %v", err)
	}
}
