package proxmox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackendInParts (issue 33): the backend is a coordinator of parts
// with one job each; none has more than 25 methods (a part that needs
// more does two jobs), counted in the package's own source.
func TestBackendInParts(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			fd, ok := n.(*ast.FuncDecl)
			if !ok || fd.Recv == nil {
				return true
			}
			typ := fd.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				counts[id.Name]++
			}
			return false
		})
	}
	if counts["Backend"] == 0 || counts["pool"] == 0 {
		t.Fatalf("no Backend or pool methods found in %v: is this the backend's directory?", files)
	}
	for typ, n := range counts {
		if n > 25 {
			t.Errorf("%s has %d methods, more than 25: split it into parts with one job each", typ, n)
		}
	}
	t.Logf("methods per type: %v", counts)
}
