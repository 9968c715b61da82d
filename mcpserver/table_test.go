package mcpserver_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoErrorTextOutsideTheTable: in the MCP adapters (the job tools and
// the Proxmox toolset), an error's text is read only in errors.go, the one
// table from an error's kind to what a client reads. Anywhere else,
// err.Error() would be a way for a store's, a backend's or the API's own
// words to reach a client beside the table. The exceptions read the text
// for a decision and send none of it.
func TestNoErrorTextOutsideTheTable(t *testing.T) {
	allowed := map[string]string{
		"mcpserver/errors.go": "the table",
		"pvetools/guests.go":  "idTaken matches Proxmox's words to decide whether a clone retries; they reach no client",
	}
	for _, dir := range []string{".", "../pvetools"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			abs, _ := filepath.Abs(file)
			name := filepath.Base(filepath.Dir(abs)) + "/" + filepath.Base(abs)
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, file, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 0 {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Error" {
					if _, ok := allowed[name]; !ok {
						t.Errorf("%s: %s.Error() outside the error table (errors.go): answer the error through toolError, "+
							"resourceError or taskError", fset.Position(call.Pos()), exprString(sel.X))
					}
				}
				return true
			})
		}
	}
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return "…"
}
