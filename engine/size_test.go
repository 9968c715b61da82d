package engine_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// maxMethods is the most methods a part of the engine has: a part that
// needs more does two jobs, and is split (issue 33).
const maxMethods = 25

// TestPartsStaySmall: no type of the engine has more than maxMethods
// methods, counted in the package's source (tests apart).
func TestPartsStaySmall(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string]int{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
				methods[receiver(fd.Recv.List[0].Type)]++
			}
		}
	}
	if len(methods) < 10 {
		t.Fatalf("only %d types with methods found: is this the engine's directory?", len(methods))
	}
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("%s has %d methods, more than %d: split it into parts with one job each", typ, n, maxMethods)
		}
	}
}

// receiver is the name of a method's receiver type.
func receiver(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiver(e.X)
	case *ast.IndexExpr:
		return receiver(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}
