package deptest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink is a Markdown link's target: [label](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// mdHeading is a Markdown heading line.
var mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)

// anchor is GitHub's anchor of a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-'.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 0x7f && (r < 0x2000 || r > 0x2bff):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinks: every relative link of the README and docs/ names a file
// that exists and, with a #fragment, a heading of it (issue 40, item 8:
// the reference moved to docs/ by topic, and a moved section must not
// leave links to where it was).
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	anchors := map[string]map[string]bool{}
	headings := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		if b, err := os.ReadFile(path); err == nil {
			for _, m := range mdHeading.FindAllStringSubmatch(string(b), -1) {
				a[anchor(m[1])] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: the link %s names no file (%v)", rel, target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(file, ".md") && !headings(file)[frag] {
				t.Errorf("%s: the link %s names no heading of %s", rel, target, filepath.Base(file))
			}
		}
	}
}
