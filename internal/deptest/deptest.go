// Package deptest holds delegate's import rules as a test, as tailscale's
// tstest/deptest does: the shape of the house (docs in DESIGN.md) is
// checked on every test run instead of kept by convention. The rules are
// in Rules; TestImportRules checks them against the packages as the go
// command sees them, on each operating system delegate builds for.
package deptest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
)

// Module is delegate's module path; rules name packages relative to it
// ("." is the root, the domain).
const Module = "github.com/delegate-dev/delegate"

// Rule forbids some packages of the module to depend on others, directly
// or through any chain of imports (test files are not counted: a test may
// wire what it needs).
type Rule struct {
	// Why is the rule in words, printed with each violation.
	Why string
	// Packages are those the rule applies to (relative paths).
	Packages []string
	// Forbidden are the packages they must not reach; Ours forbids every
	// package of the module but the root (which everyone may import).
	Forbidden []string
	Ours      bool
	// Except lets a package reach a forbidden one through one named
	// package only (with the reason in its own words); any other chain
	// still fails.
	Except []Exception
}

// Exception allows the chains from Package that go through Via.
type Exception struct {
	Package, Via, Why string
}

// Graph is the module's packages and, for each, the module's packages it
// imports directly (relative paths).
type Graph map[string][]string

// Load lists the module's packages under dir with the go command, for one
// GOOS ("" for this one).
func Load(ctx context.Context, dir, goos string) (Graph, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	cmd.Dir = dir
	if goos != "" {
		cmd.Env = append(cmd.Environ(), "GOOS="+goos)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list (GOOS=%s): %w: %s", goos, err, stderr.Bytes())
	}
	g := Graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list (GOOS=%s): %s: %s", goos, p.ImportPath, p.Error.Err)
		}
		name, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		var ours []string
		for _, imp := range p.Imports {
			if r, ok := relative(imp); ok {
				ours = append(ours, r)
			}
		}
		g[name] = ours
	}
	return g, nil
}

func relative(path string) (string, bool) {
	if path == Module {
		return ".", true
	}
	r, ok := strings.CutPrefix(path, Module+"/")
	return r, ok
}

// Violation is a package that reaches one it must not.
type Violation struct {
	Package, Forbidden string
	// Chain is one import chain from Package to Forbidden.
	Chain []string
	Rule  *Rule
}

func (v Violation) String() string {
	how := "imports it directly"
	if len(v.Chain) > 2 {
		how = "through " + strings.Join(v.Chain, " → ")
	}
	return fmt.Sprintf("package %s imports %s (%s), which breaks the rule: %s", display(v.Package), v.Forbidden, how, v.Rule.Why)
}

func display(pkg string) string {
	if pkg == "." {
		return "delegate (the module root)"
	}
	return pkg
}

// Check returns every violation of rules in g, in a stable order. A rule
// naming a package g does not have is itself an error (a rule about a
// renamed package would silently hold).
func Check(g Graph, rules []Rule) ([]Violation, error) {
	var out []Violation
	for i := range rules {
		r := &rules[i]
		for _, name := range append(slices.Clone(r.Packages), r.Forbidden...) {
			if _, ok := g[name]; !ok {
				return nil, fmt.Errorf("rule %q names package %s, which does not exist", r.Why, name)
			}
		}
		for _, pkg := range r.Packages {
			var skip []string
			for _, e := range r.Except {
				if e.Package == pkg {
					skip = append(skip, e.Via)
				}
			}
			chains := reach(g, pkg, skip)
			forbidden := r.Forbidden
			if r.Ours {
				forbidden = nil
				for name := range g {
					if name != "." && name != pkg {
						forbidden = append(forbidden, name)
					}
				}
				slices.Sort(forbidden)
			}
			for _, f := range forbidden {
				if chain, ok := chains[f]; ok {
					out = append(out, Violation{Package: pkg, Forbidden: f, Chain: chain, Rule: r})
				}
			}
		}
	}
	return out, nil
}

// reach finds, breadth first, a shortest import chain from pkg to every
// package it depends on, without going through the packages in skip.
func reach(g Graph, pkg string, skip []string) map[string][]string {
	chains := map[string][]string{pkg: {pkg}}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p] {
			if _, seen := chains[imp]; seen || slices.Contains(skip, imp) {
				continue
			}
			chains[imp] = append(slices.Clone(chains[p]), imp)
			queue = append(queue, imp)
		}
	}
	delete(chains, pkg)
	return chains
}
