//go:build linux

package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestForkIdentity (issue 38): each fork of a kept sandbox with an
// allowlist has an identity of its own, none the source's: its host ids
// (the uid map its processes see), its egress token (its network's, by
// which the proxy knows it), its commands' callback tokens; all keep the
// source's allowlist, and one widened in one fork is widened neither in
// another nor in the source.
func TestForkIdentity(t *testing.T) {
	t.Parallel()
	eng, f, src, ok := allowlistedSandbox(t)
	if !ok {
		return
	}
	ctx := context.Background()
	forks, err := eng.ForkSandbox(ctx, delegate.ForkSpec{From: src.ID, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{src.ID, forks[0].ID, forks[1].ID}
	probe := `echo "uid $(id -u)"; echo "map $(tr -s ' ' < /proc/self/uid_map)"; echo "token $DELEGATE_JOB_TOKEN"
` + reachProbe
	field := func(out, name string) string {
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("no %s in:\n%s", name, out)
		return ""
	}
	seen := map[string]string{}
	distinct := func(what, v, id string) {
		if v == "" {
			t.Errorf("%s of %s is empty", what, id)
		}
		if other, ok := seen[what+v]; ok {
			t.Errorf("%s and %s have the same %s: %q", other, id, what, v)
		}
		seen[what+v] = id
	}
	for _, id := range ids {
		_, out := runToEnd(t, eng, delegate.Manifest{Task: probe, Sandbox: id})
		if field(out, "uid") != "1000" || !strings.Contains(out, "reached http://allowed.test/") || !strings.Contains(out, "refused http://denied.test/") {
			t.Errorf("%s before any widening:\n%s", id, out)
		}
		distinct("uid map", field(out, "map"), id)
		distinct("callback token", field(out, "token"), id)
		n, err := f.store.GetNetwork(ctx, id)
		if err != nil {
			t.Fatalf("the network of %s: %v", id, err)
		}
		distinct("egress token", n.TokenHash, id)
	}

	if _, err := eng.AllowNetwork(ctx, forks[0].ID, []string{"denied.test"}, "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		_, out := runToEnd(t, eng, delegate.Manifest{Task: probe, Sandbox: id})
		widened := id == forks[0].ID
		if strings.Contains(out, "reached http://denied.test/") != widened {
			t.Errorf("%s (widened: %v) after the first fork's allowlist was widened:\n%s", id, widened, out)
		}
		n, err := f.store.GetNetwork(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(n.Policy.Allow, "denied.test") != widened {
			t.Errorf("the recorded allowlist of %s (widened: %v): %v", id, widened, n.Policy.Allow)
		}
	}
	for _, id := range ids {
		if _, _, err := eng.ReleaseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
