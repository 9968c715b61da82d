package deptest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestImportRules checks Rules against the module, as built for each
// operating system delegate builds for (some files are Linux only).
func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, goos := range []string{"linux", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g, err := Load(ctx, root, goos)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := g["."]; !ok || len(g["engine"]) == 0 {
				t.Fatalf("implausible package graph (%d packages): root %v, engine imports %v", len(g), g["."], g["engine"])
			}
			violations, err := Check(g, Rules())
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range violations {
				t.Error(v)
			}
		})
	}
}

// TestCheck: the checker finds a forbidden import, direct or through
// other packages, names the chain and the rule, and lets an exception
// through only along its own path.
func TestCheck(t *testing.T) {
	g := Graph{
		".":         nil,
		"sandbox":   {"."},
		"engine":    {".", "sandbox"},
		"sqlite":    {"."},
		"local":     {"sandbox"},
		"pvesim":    {"local", "sandbox"},
		"mcpserver": {"."},
		"httpapi":   {".", "helper"},
		"helper":    {"engine"},
		"cli":       {".", "pvesim"},
		"dashboard": {".", "sqlite"},
	}
	rules := []Rule{
		{Why: "root alone", Packages: []string{"."}, Ours: true},
		{Why: "adapters: no engine, store or backend", Packages: []string{"mcpserver", "httpapi", "cli", "dashboard"},
			Forbidden: []string{"engine", "sqlite", "local"},
			Except:    []Exception{{Package: "cli", Via: "pvesim", Why: "the simulator"}}},
	}
	got, err := Check(g, rules)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, v := range got {
		lines = append(lines, v.String())
	}
	want := []string{
		"package httpapi imports engine (through httpapi → helper → engine), which breaks the rule: adapters: no engine, store or backend",
		"package dashboard imports sqlite (imports it directly), which breaks the rule: adapters: no engine, store or backend",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	// The exception covers the chain through pvesim only.
	g["cli"] = append(g["cli"], "local")
	got, _ = Check(g, rules)
	if len(got) != 3 || got[1].Package != "cli" || got[1].Forbidden != "local" || len(got[1].Chain) != 2 {
		t.Errorf("a direct import beside the excepted chain: %v", got)
	}

	// The root importing anything of ours breaks the first rule.
	g["."] = []string{"sandbox"}
	got, _ = Check(g, rules)
	if len(got) == 0 || got[0].Package != "." || got[0].Forbidden != "sandbox" {
		t.Errorf("root importing sandbox: %v", got)
	}

	// A rule about a package that is gone is an error, not a pass.
	if _, err := Check(g, []Rule{{Why: "x", Packages: []string{"gone"}, Ours: true}}); err == nil {
		t.Error("a rule naming a missing package was accepted")
	}
}
