package deptest

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The checks of the house's shape that read the source itself (the import
// rules read the go command's package list): parts that stay small,
// adapters that take their services by name, goroutines with owners. They
// parse files only (no type checking), so they are cheap.

// moduleRoot is the module's directory, from this package's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// sourceFile is a parsed Go file of the module.
type sourceFile struct {
	pkg  string // its directory, relative to the module's ("." the root)
	name string // its path, relative to the module's
	fset *token.FileSet
	file *ast.File
}

// parseSource parses the module's Go files under dirs (relative; none:
// all) that a build for goos compiles: the test files with tests, the
// others without. It
// skips testdata, node_modules and hidden directories.
func parseSource(t *testing.T, goos string, tests bool, dirs ...string) []sourceFile {
	t.Helper()
	root := moduleRoot(t)
	ctx := build.Default
	ctx.GOOS = goos
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	var out []sourceFile
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if n := d.Name(); n == "testdata" || n == "node_modules" || strings.HasPrefix(n, ".") && p != root {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") != tests {
				return nil
			}
			if ok, err := ctx.MatchFile(filepath.Dir(p), d.Name()); err != nil || !ok {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution|parser.ParseComments)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			out = append(out, sourceFile{pkg: filepath.Dir(rel), name: rel, fset: fset, file: f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no Go files under %v", dirs)
	}
	return out
}

// MaxMethods is the most methods a type of ours has (issue 33): a part
// that grows past it is split into parts that each own their state.
const MaxMethods = 25

// methodExceptions are the types with one method per thing of the outside
// world they stand for, which may have more.
var methodExceptions = map[string]string{
	"pve.Client":     "an API client: one method per Proxmox endpoint",
	"pvesim.Server":  "the simulator is the Proxmox API's other side: one method per endpoint it serves",
	"cli.Program":    "the command line: one method per command",
	"pvetools.tools": "the tool registry: one method per tool",
}

// splitting are the types being split right now, each with who splits
// it: a temporary list, whose entry goes as the type gets under
// MaxMethods (the test fails on an entry no longer needed, so that the
// list only shrinks). Issue 33's item 1 emptied it (engine.runner,
// engine.keeper, local.Backend and proxmox.Backend were on it; then
// egress.Proxy for a while).
//
// To the engineer named: remove your entry when the type is split.
var splitting = map[string]string{}

// TestMethodCounts: no type declared in the module's non-test files has
// more than MaxMethods methods, but the exceptions above. Methods are
// counted as a build for Linux, and for macOS, compiles them.
func TestMethodCounts(t *testing.T) {
	over := map[string]bool{}
	for _, goos := range []string{"linux", "darwin"} {
		counts := map[string]int{}
		for _, f := range parseSource(t, goos, false) {
			for _, decl := range f.file.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv != nil {
					counts[filepath.Base(f.pkg)+"."+receiverType(fd.Recv.List[0].Type)]++
				}
			}
		}
		for typ, n := range counts {
			if n <= MaxMethods {
				continue
			}
			over[typ] = true
			if methodExceptions[typ] != "" || splitting[typ] != "" {
				continue
			}
			t.Errorf("%s (%s) has %d methods, more than %d: split it into parts that own their state, each called "+
				"through a small interface of its caller's", typ, goos, n, MaxMethods)
		}
	}
	for typ, who := range splitting {
		if !over[typ] {
			t.Errorf("%s has no more than %d methods now: remove it from the list of types being split (%s)", typ, MaxMethods, who)
		}
	}
}

// receiverType is the name of a method's receiver's type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

// adapters are the packages over the root's services (and cmd/, which
// wires them).
var adapters = []string{"mcpserver", "pvetools", "httpapi", "httpauth", "dashboard", "cli", "metrics", "cmd"}

// TestNoServiceAssertionInAdapters: an adapter takes the services it uses
// as named fields (mcpserver.Services, dashboard.Services, ...), which
// cmd/ fills from the engine: a service the engine stops implementing then
// fails the build. A type assertion to a service (svc.(delegate.XService))
// would instead leave a tool out at run time, unseen; so would one to a
// concrete engine or backend.
func TestNoServiceAssertionInAdapters(t *testing.T) {
	for _, f := range parseSource(t, "linux", false, adapters...) {
		for _, bad := range serviceAssertions(f.fset, f.file) {
			t.Errorf("%s: %s: take the service as a named field of the adapter's services, which cmd/ wires", bad, f.name)
		}
	}
}

// serviceAssertions finds the type assertions and type switches of f to
// a service of the root package (a delegate.…Service) or to the engine or
// a backend.
func serviceAssertions(fset *token.FileSet, f *ast.File) []string {
	var out []string
	check := func(pos token.Pos, typ ast.Expr) {
		if name := assertedService(typ); name != "" {
			out = append(out, fset.Position(pos).String()+": a type assertion to "+name)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.TypeAssertExpr:
			if n.Type != nil {
				check(n.Pos(), n.Type)
			}
		case *ast.TypeSwitchStmt:
			for _, c := range n.Body.List {
				for _, typ := range c.(*ast.CaseClause).List {
					check(typ.Pos(), typ)
				}
			}
		}
		return true
	})
	return out
}

func assertedService(typ ast.Expr) string {
	star := ""
	if s, ok := typ.(*ast.StarExpr); ok {
		typ, star = s.X, "*"
	}
	sel, ok := typ.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return ""
	}
	name := star + pkg.Name + "." + sel.Sel.Name
	switch {
	case pkg.Name == "delegate" && strings.HasSuffix(sel.Sel.Name, "Service"),
		pkg.Name == "engine" && sel.Sel.Name == "Engine",
		(pkg.Name == "proxmox" || pkg.Name == "local") && sel.Sel.Name == "Backend":
		return name
	}
	return ""
}

// TestServiceAssertionsFound: the check above finds what it looks for.
func TestServiceAssertionsFound(t *testing.T) {
	src := `package p
func f(svc any) {
	_, _ = svc.(delegate.SandboxService)
	_ = svc.(*proxmox.Backend)
	switch svc.(type) {
	case delegate.QuestionService, error:
	}
	_, _ = svc.(interface{ Close() error }) // not a service
	_, _ = svc.(delegate.Sandbox)           // not a service
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := serviceAssertions(fset, f)
	if len(got) != 3 || !strings.Contains(got[0], "delegate.SandboxService") || !strings.Contains(got[1], "*proxmox.Backend") ||
		!strings.Contains(got[2], "delegate.QuestionService") {
		t.Errorf("found %q", got)
	}
}

// goroutineOwners are the go statements of cmd/ and the adapters that
// start a goroutine no part waits for, each with why. Every other
// goroutine they start runs in a group that is waited for (an errgroup in
// serve, a sync.WaitGroup of the call or the part that started it).
var goroutineOwners = map[string]string{
	"mcpserver/stdio.go": "the stdio connection's reader of an input that is no pipe: Close closes the input, " +
		"which ends the read, but a read of a blocking descriptor cannot be made to end, so Close does not wait for it",
}

// TestGoroutineOwners: cmd/ and the adapters start no goroutine with a
// bare go statement, but where goroutineOwners says why.
func TestGoroutineOwners(t *testing.T) {
	for _, f := range parseSource(t, "linux", false, adapters...) {
		ast.Inspect(f.file, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok && goroutineOwners[filepath.ToSlash(f.name)] == "" {
				t.Errorf("%s: a go statement: run the goroutine in a group its owner waits for "+
					"(the errgroup of serve, a sync.WaitGroup's Go), or say in goroutineOwners why none can", f.fset.Position(g.Pos()))
			}
			return true
		})
	}
}
