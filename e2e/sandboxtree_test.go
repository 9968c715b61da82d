//go:build linux

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestSandboxTreeInChromium (issue 38): a kept sandbox's page in the
// browser shows its checkpoints and, under the one they were made from,
// its forks, linked; following a fork's link, its page says what it was
// forked from; a checkpoint made while the page is open appears in it
// live.
func TestSandboxTreeInChromium(t *testing.T) {
	b := newBrowser(t)
	dataDir := t.TempDir()
	base := startHTTP(t, dataDir, nil, "DELEGATE_TOOLSETS=jobs,checkpoints")
	cs := httpSession(t, base+"/mcp", "")
	id := call[sandboxOut](t, cs, "open_sandbox", map[string]any{}).SandboxID
	type checkpointOut struct {
		Checkpoint struct {
			ID string `json:"checkpoint_id"`
		} `json:"checkpoint"`
	}
	first := call[checkpointOut](t, cs, "sandbox_checkpoint", map[string]any{"action": "checkpoint", "sandbox_id": id, "name": "deps"}).Checkpoint.ID
	forks := call[struct {
		Forks []sandboxOut `json:"forks"`
	}](t, cs, "open_sandbox", map[string]any{"from": first, "count": 2}).Forks
	if len(forks) != 2 {
		t.Fatalf("forks: %+v", forks)
	}
	cp := `li.checkpoint[data-checkpoint="` + first + `"]`
	b.do(t, "open the source's page", chromedp.Navigate(base+"/sandboxes/"+id), chromedp.WaitVisible(chromedp.CSS(cp)))
	if s := b.text(t, cp+" .name"); s != "deps" {
		t.Errorf("the checkpoint's name shown as %q", s)
	}
	for _, f := range forks {
		if n := b.eval(t, `document.querySelectorAll(`+jsString(cp+` li.fork a[href="/sandboxes/`+f.SandboxID+`"]`)+`).length === 1`); !n {
			t.Errorf("fork %s is not drawn under checkpoint %s", f.SandboxID, first)
		}
	}
	b.waitFor(t, "the live updates to connect", `document.querySelector('#live-state.on') !== null`, 10*time.Second)
	second := call[checkpointOut](t, cs, "sandbox_checkpoint", map[string]any{"action": "checkpoint", "sandbox_id": id}).Checkpoint.ID
	b.waitFor(t, "the new checkpoint in the tree", `document.querySelector(`+jsString(`li.checkpoint[data-checkpoint="`+second+`"]`)+`) !== null`, 20*time.Second)
	b.shoot(t, "dashboard-sandbox-tree.png", 1280, 700)

	b.do(t, "follow a fork's link", chromedp.Click(chromedp.CSS(cp+` li.fork a[href="/sandboxes/`+forks[0].SandboxID+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("li.source")))
	if s := b.text(t, "li.source"); !strings.Contains(s, "forked from "+id) || !strings.Contains(s, first) {
		t.Errorf("the fork's page says %q", s)
	}
	for _, sb := range append(forks, sandboxOut{SandboxID: id}) {
		call[sandboxOut](t, cs, "release_job", map[string]any{"sandbox_id": sb.SandboxID})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		t.Errorf("browser: %s", p)
	}
}
