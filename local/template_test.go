//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestTemplateIsAName: a job names a root filesystem of the rootfs
// directory; it can never make the sandbox show a host path. Before names,
// vmTemplate "/" gave a job a read-only view of the whole host, and the
// path of another sandbox's workspace that job's files.
func TestTemplateIsAName(t *testing.T) {
	b := newBackend(t, 0)
	name := useRootfs(b, buildRootfs(t))
	ctx := context.Background()

	victim := create(t, b, defaultSpec())
	if err := victim.WriteFile(ctx, "/workspace/secret", []byte("victim's data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A host directory any job could otherwise read through a template.
	hostDir := t.TempDir()
	os.Chmod(hostDir, 0o755)
	os.MkdirAll(filepath.Join(hostDir, "bin"), 0o755)
	os.WriteFile(filepath.Join(hostDir, "bin/sh"), []byte("#!"), 0o755)

	for _, tpl := range []string{
		"/",
		victim.path(dirWorkspace),
		victim.dir,
		b.dir,
		hostDir,
		filepath.Join(b.roots.rootfsDir, name), // its own path: names only
		"../" + name,
		name + "/..",
		"./" + name,
		"." + name,
		"..",
		"Upper",
		"-dash",
		name + "/bin",
		"missing",
		strings.Repeat("a", maxTemplateName+1),
	} {
		t.Run(tpl, func(t *testing.T) {
			err := b.CheckTemplate(ctx, tpl)
			var te *sandbox.TemplateError
			if !errors.As(err, &te) {
				t.Fatalf("CheckTemplate(%q) = %v, want a *sandbox.TemplateError", tpl, err)
			}
			if !slices.Contains(te.Available, name) || !strings.Contains(err.Error(), "available: "+name) {
				t.Errorf("the error does not list the templates there are: %v", err)
			}
			spec := defaultSpec()
			spec.Template = tpl
			sb, err := b.Create(ctx, spec)
			if err == nil {
				// The attack: what does the job see?
				_, out := run(t, sb, "/bin/sh", "-c", "ls / /workspace; cat /secret /workspace/secret 2>&1")
				sb.Destroy(ctx)
				t.Fatalf("Create accepted vmTemplate %q; the job saw:\n%s", tpl, out)
			}
			if !errors.As(err, &te) {
				t.Errorf("Create: %v, want a *sandbox.TemplateError", err)
			}
		})
	}
	if err := b.CheckTemplate(ctx, name); err != nil {
		t.Fatalf("a good name is refused: %v", err)
	}
	if ids, _ := b.List(ctx); len(ids) != 1 {
		t.Errorf("refused templates left sandboxes: %v", ids)
	}
}

// TestTemplateOwnership: a root filesystem the sandboxes' users could
// change (owned by one of them, or writable by them) is refused, with the
// reason.
func TestTemplateOwnership(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	// A job's host uid in some sandbox's slot, the last slot's base, and
	// the one range every sandbox had before slots.
	hostJobID := int(b.slots.r.first) + 5*slotSize + jobID
	lastBase := int(b.slots.r.last) + 1 - slotSize
	tests := []struct {
		name  string
		spoil func(root string) error
		want  string // in the error; "" = accepted
	}{
		{"good", func(string) error { return nil }, ""},
		{"group-writable by root's group", func(root string) error { return os.Chmod(root, 0o775) }, ""},
		{"owned by a sandbox user", func(root string) error { return os.Chown(root, hostJobID, 0) }, "must be owned by root"},
		{"owned by another user", func(root string) error { return os.Chown(root, 1000, 0) }, "must be owned by root"},
		{"world-writable", func(root string) error { return os.Chmod(root, 0o777) }, "must not be writable"},
		{"group-writable by a sandbox group", func(root string) error {
			if err := os.Chown(root, 0, hostJobID); err != nil {
				return err
			}
			return os.Chmod(root, 0o775)
		}, "must not be writable"},
		{"a top directory owned by a sandbox user", func(root string) error {
			return os.Chown(filepath.Join(root, "bin"), lastBase, lastBase)
		}, "one of the sandboxes' users"},
		{"a top directory owned by a user of the old range", func(root string) error {
			return os.Chown(filepath.Join(root, "bin"), legacyIDBase+jobID, 0)
		}, "one of the sandboxes' users"},
		{"a world-writable top directory", func(root string) error { return os.Chmod(filepath.Join(root, "bin"), 0o777) }, "must not be writable"},
		{"not searchable by the sandbox", func(root string) error { return os.Chmod(root, 0o750) }, "o+rx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := buildRootfs(t)
			if err := tc.spoil(root); err != nil {
				t.Fatal(err)
			}
			name := useRootfs(b, root)
			err := b.CheckTemplate(ctx, name)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckTemplate = %v, want an error with %q", err, tc.want)
			}
			spec := defaultSpec()
			spec.Template = name
			if sb, err := b.Create(ctx, spec); err == nil {
				sb.Destroy(ctx)
				t.Fatal("Create accepted it")
			}
		})
	}
}

// TestTemplateLinks: the operator may link a name elsewhere, but not to the
// host's root or to the sandboxes.
func TestTemplateLinks(t *testing.T) {
	b := newBackend(t, 0)
	ctx := context.Background()
	root := buildRootfs(t)
	b.roots.rootfsDir = t.TempDir()
	for name, target := range map[string]string{"elsewhere": root, "host": "/", "sandboxes": b.dir} {
		if err := os.Symlink(target, filepath.Join(b.roots.rootfsDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.CheckTemplate(ctx, "elsewhere"); err != nil {
		t.Errorf("a link to a good rootfs: %v", err)
	}
	for name, want := range map[string]string{"host": "host's root directory", "sandboxes": "sandboxes of other jobs"} {
		if err := b.CheckTemplate(ctx, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: CheckTemplate = %v, want %q", name, err, want)
		}
	}
}

// TestDefaultTemplatePath: the operator's default may be a path; that one
// path, and no other, is accepted.
func TestDefaultTemplatePath(t *testing.T) {
	canRun(t)
	root := buildRootfs(t)
	other := buildRootfs(t)
	b, err := New(Config{Dir: t.TempDir(), DefaultTemplate: root})
	if err != nil {
		t.Fatal(err)
	}
	spec := defaultSpec()
	spec.Template = root
	exit, out := run(t, create(t, b, spec), "/bin/sh", "-c", "read x < /marker; echo $x")
	if exit.Code != 0 || out != "from-the-template\n" {
		t.Fatalf("default template: exit %+v, output %q", exit, out)
	}
	if err := b.CheckTemplate(context.Background(), other); err == nil {
		t.Fatal("a path other than the default was accepted")
	}
	for _, bad := range []Config{
		{Dir: t.TempDir(), DefaultTemplate: root + "/"},
		{Dir: filepath.Join(root, "sandboxes"), RootfsDir: root},
		{Dir: root, RootfsDir: filepath.Join(root, "rootfs")},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}
