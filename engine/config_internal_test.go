package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// sameConfig reports the fields where a and b differ (functions compared
// by their code).
func sameConfig(t *testing.T, got, want Config) {
	t.Helper()
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		name := gv.Type().Field(i).Name
		g, w := gv.Field(i), wv.Field(i)
		if g.Kind() == reflect.Func {
			if g.Pointer() != w.Pointer() {
				t.Errorf("%s: another function than the default's", name)
			}
			continue
		}
		if !reflect.DeepEqual(g.Interface(), w.Interface()) {
			t.Errorf("%s = %v, want %v", name, g.Interface(), w.Interface())
		}
	}
}

// TestDefaultConfig: DefaultConfig names every field of Config (the one
// table of defaults, a line each), and an engine made with a zero Config
// runs with exactly it.
func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	ast.Inspect(f, func(n ast.Node) bool {
		fd, ok := n.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "DefaultConfig" {
			return true
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if kv, ok := n.(*ast.KeyValueExpr); ok {
				if id, ok := kv.Key.(*ast.Ident); ok {
					listed = append(listed, id.Name)
				}
			}
			return true
		})
		return false
	})
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		if name := typ.Field(i).Name; !slices.Contains(listed, name) {
			t.Errorf("Config.%s has no line in DefaultConfig", name)
		}
	}

	e := New(testkit.OpenStore(t), nil, Config{})
	defer e.Close()
	sameConfig(t, e.cfg, DefaultConfig())
}

// TestConfigWithDefaults: what a Config sets stays; what it leaves zero,
// or sets below zero where that means nothing, is the default's.
func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	d := DefaultConfig()
	for _, tc := range []struct {
		name string
		in   Config
		want func(*Config)
	}{
		{"zero", Config{}, func(*Config) {}},
		{"set", Config{MaxConcurrent: 9, PollInterval: time.Second, CloneDir: "/srv/clones", MinFree: 5},
			func(c *Config) {
				c.MaxConcurrent, c.PollInterval, c.CloneDir, c.MinFree = 9, time.Second, "/srv/clones", 5
			}},
		{"negative counts and durations", Config{MaxConcurrent: -1, OutputLimit: -1, SandboxTick: -time.Second, PruneInterval: -1},
			func(*Config) {}},
		{"negative retention keeps forever", Config{Retention: -1}, func(c *Config) { c.Retention = -1 }},
		{"negative floor is none", Config{MinFree: -1}, func(c *Config) { c.MinFree = -1 }},
		{"manifest defaults per field", Config{Defaults: delegate.Defaults{Memory: "8G"}},
			func(c *Config) { c.Defaults.Memory = "8G" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := d
			tc.want(&want)
			sameConfig(t, tc.in.withDefaults(), want)
		})
	}
}
