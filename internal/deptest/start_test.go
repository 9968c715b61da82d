package deptest

import (
	"go/ast"
	"testing"
)

// compilers are the calls that compile a regular expression.
var compilers = map[string]bool{"MustCompile": true, "Compile": true, "MustCompilePOSIX": true, "CompilePOSIX": true}

// TestNoRegexpCompiledAtStart: no package-level variable of the module's
// non-test files compiles a regular expression as the binary starts
// (issue 41, item 2). Every CLI call of the one binary runs every
// package's initialisation, and the ~85 expressions compiled there were a
// sixth of `delegate --version`'s CPU time; they are compiled when first
// used (sync.OnceValue) instead.
func TestNoRegexpCompiledAtStart(t *testing.T) {
	seen := map[string]bool{}
	for _, goos := range []string{"linux", "darwin"} {
		for _, f := range parseSource(t, goos, false) {
			for _, d := range f.file.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, s := range gd.Specs {
					vs, ok := s.(*ast.ValueSpec)
					if !ok {
						continue
					}
					for _, v := range vs.Values {
						if pos, ok := compilesRegexp(v); ok && !seen[f.fset.Position(pos.Pos()).String()] {
							seen[f.fset.Position(pos.Pos()).String()] = true
							t.Errorf("%s: a package-level variable compiles a regular expression when the binary starts: "+
								"compile it when first used (sync.OnceValue)", f.fset.Position(pos.Pos()))
						}
					}
				}
			}
		}
	}
}

// compilesRegexp reports where e calls regexp's compilers outside a
// function literal (whose body runs when called, not when e is evaluated).
func compilesRegexp(e ast.Expr) (pos ast.Node, found bool) {
	ast.Inspect(e, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && compilers[sel.Sel.Name] {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "regexp" {
					pos, found = n, true
				}
			}
		}
		return true
	})
	return pos, found
}
