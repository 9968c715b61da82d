package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// versionVar is the variable a release build sets with -ldflags -X, and
// e2eVersion what TestMain sets it to.
const (
	versionVar = "github.com/delegate-dev/delegate/internal/buildinfo.version"
	e2eVersion = "v0.0.0-e2e.1"
)

// TestVersionIsOne: the built binary says one version everywhere it says
// one: `delegate --version`, `delegate version`, the MCP serverInfo (over
// stdio and over HTTP), delegate_build_info on /metrics and the
// dashboard's footer.
func TestVersionIsOne(t *testing.T) {
	dataDir := t.TempDir()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, errOut, code := delegateCLI(t, dataDir, args...)
		if code != 0 || out != "delegate "+e2eVersion+"\n" {
			t.Errorf("delegate %s: exit %d stdout %q stderr %q; want %q", args[0], code, out, errOut, "delegate "+e2eVersion)
		}
	}

	cs, _, _ := stdioSession(t, t.TempDir(), "")
	if got := cs.InitializeResult().ServerInfo; got.Name != "delegate" || got.Version != e2eVersion {
		t.Errorf("serverInfo over stdio: %+v, want version %q", got, e2eVersion)
	}

	base := startHTTP(t, t.TempDir(), nil)
	hs := httpSession(t, base+"/mcp", "")
	if got := hs.InitializeResult().ServerInfo.Version; got != e2eVersion {
		t.Errorf("serverInfo over HTTP: version %q, want %q", got, e2eVersion)
	}
	_, _, metrics := fetch(t, http.DefaultClient, "GET", base+"/metrics")
	info := regexp.MustCompile(`(?m)^delegate_build_info\{goversion="go[^"]+",revision="[^"]+",version="([^"]*)"\} 1$`).FindStringSubmatch(metrics)
	if info == nil || info[1] != e2eVersion {
		t.Errorf("/metrics: delegate_build_info %q, want version %q", info, e2eVersion)
	}
	_, _, page := fetch(t, http.DefaultClient, "GET", base+"/", "Accept", "text/html")
	if !strings.Contains(page, `<footer class="foot">delegate `+e2eVersion+`</footer>`) {
		t.Errorf("the dashboard's footer does not say %s", e2eVersion)
	}
}

// TestVersionFromGitCheckout: built with nothing set, in a git checkout
// (as `go build ./cmd/delegate` after a clone), the binary says the commit
// it was built from, not "dev", in --version and in serverInfo alike. The
// go command stamps a checkout only where .git is a directory (not in a
// git worktree, whose .git is a file) and with -buildvcs not false.
func TestVersionFromGitCheckout(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Skip("not a git checkout with a .git directory (a worktree or an export): the go command records no revision here")
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("git rev-parse HEAD: %v", err)
	}
	rev := strings.TrimSpace(string(head))
	bin := filepath.Join(t.TempDir(), "delegate")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/delegate")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimPrefix(strings.TrimSpace(string(out)), "delegate ")
	if version == "dev" || !strings.Contains(version, rev[:12]) {
		t.Errorf("--version of a build at %s: %q", rev[:12], version)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = serverEnv(t.TempDir())
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := cs.InitializeResult().ServerInfo.Version; got != version {
		t.Errorf("serverInfo says %q, --version %q", got, version)
	}
}
