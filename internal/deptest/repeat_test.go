package deptest

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MinRepeat is the length of a block of lines no two test files may both
// hold (issue 33): test code that repeats itself that much is a helper
// waiting to be written once, in internal/testkit or beside the tests of
// one package.
const MinRepeat = 15

// TestNoRepeatedTestBlocks: no MinRepeat lines of one _test.go file
// stand, the same, in another. Lines are compared as code: without their
// indentation, blank lines, comments, imports and lines of punctuation
// alone ("}", "})", ")"), which any two files share.
func TestNoRepeatedTestBlocks(t *testing.T) {
	root := moduleRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "node_modules" || strings.HasPrefix(n, ".") && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	type place struct {
		file string
		line int
	}
	first := map[[32]byte]place{}
	reported := map[[2]string]bool{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		lines, at := codeLines(string(data))
		for i := 0; i+MinRepeat <= len(lines); i++ {
			sum := sha256.Sum256([]byte(strings.Join(lines[i:i+MinRepeat], "\n")))
			p, seen := first[sum]
			if !seen {
				first[sum] = place{rel, at[i]}
				continue
			}
			pair := [2]string{p.file, rel}
			if p.file == rel || reported[pair] {
				continue
			}
			reported[pair] = true
			t.Errorf("%s:%d and %s:%d hold the same %d lines (or more): write them once, as a helper "+
				"(internal/testkit for tests of several packages)", p.file, p.line, rel, at[i], MinRepeat)
		}
	}
}

// codeLines are the lines of a Go file that count as code, trimmed, and
// the line number of each.
func codeLines(src string) ([]string, []int) {
	var out []string
	var at []int
	inImport, inComment := false, false
	for n, line := range strings.Split(src, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case inComment:
			if strings.Contains(l, "*/") {
				inComment = false
			}
			continue
		case strings.HasPrefix(l, "/*"):
			inComment = !strings.Contains(l, "*/")
			continue
		case inImport:
			inImport = l != ")"
			continue
		case l == "import (":
			inImport = true
			continue
		case l == "" || strings.HasPrefix(l, "//") || strings.HasPrefix(l, "import ") || strings.Trim(l, "{}()[],;") == "":
			continue
		}
		out = append(out, l)
		at = append(at, n+1)
	}
	return out, at
}

// TestCodeLines: what the repeat check compares.
func TestCodeLines(t *testing.T) {
	src := "package p\n\nimport (\n\t\"fmt\"\n)\n\n// a comment\nfunc f() {\n\t/* a\n\tblock */\n\tfmt.Println(1)\n\t})\n}\n"
	got, at := codeLines(src)
	want := []string{"package p", "func f() {", "fmt.Println(1)"}
	if strings.Join(got, "|") != strings.Join(want, "|") || len(at) != 3 || at[2] != 11 {
		t.Errorf("code lines %q at %v, want %q", got, at, want)
	}
}
