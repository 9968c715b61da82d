//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestSandboxAccounts: the sandbox's passwd and group keep the host's
// system accounts, lose its people and its groups' members, and name the
// job's ids "sandbox".
func TestSandboxAccounts(t *testing.T) {
	passwd, group := sandboxAccounts([]byte(`root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
# a comment
+nis
broken line
cloudsdk:x:1000:1000::/home/cloudsdk:/bin/bash
alice:x:1001:1001:Alice:/home/alice:/bin/bash
sandbox:x:999:999::/:/bin/false
`), []byte(`root:x:0:
sudo:x:27:alice,cloudsdk
cloudsdk:x:1000:
nogroup:x:65534:
`))
	if want := "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n" +
		"sandbox:x:1000:1000:delegate job:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"; string(passwd) != want {
		t.Errorf("passwd:\n%s\nwant:\n%s", passwd, want)
	}
	if want := "root:x:0:\nsudo:x:27:\nnogroup:x:65534:\nsandbox:x:1000:\n"; string(group) != want {
		t.Errorf("group:\n%s\nwant:\n%s", group, want)
	}
}

// TestJobEnvironment: what a job of the host view sees of users and tools
// — its own user named sandbox, no host account of uid 1000 or above, a
// standard PATH that finds the host's Go toolchain and the operator's
// tool directories (bound read-only), and a PATH it set itself kept —
// with the C and the Go helpers.
func TestJobEnvironment(t *testing.T) {
	tools := filepath.Join("/opt", "delegate-test-tools-"+filepath.Base(t.TempDir()))
	if err := os.MkdirAll(filepath.Join(tools, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tools) })
	if err := os.WriteFile(filepath.Join(tools, "bin", "delegate-test-tool"), []byte("#!/bin/sh\necho tool ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range helperModes() {
		t.Run(mode, func(t *testing.T) {
			canRun(t)
			b, err := New(Config{Dir: t.TempDir(), ToolDirs: []string{tools}})
			if err != nil {
				t.Fatal(err)
			}
			b.shims.goHelpers = mode == "Go"
			sb := create(t, b, defaultSpec())
			p, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", `
				id; whoami; ls -ld /workspace | awk '{print "owner", $3}'
				awk -F: '$3 >= 1000 && $3 != 65534 {print "account", $1}' /etc/passwd
				echo "PATH=$PATH"; delegate-test-tool
				touch ` + tools + `/x 2>/dev/null || echo "tools read-only"`},
				Env: []string{"PATH=" + sandbox.DefaultPath}, OutputLimit: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			exit, out := finish(t, p)
			if exit.Code != 0 {
				t.Fatalf("exit %+v:\n%s", exit, out)
			}
			wantPath := "PATH=" + sandbox.DefaultPath
			if _, err := os.Stat("/usr/local/go/bin"); err == nil {
				wantPath += ":/usr/local/go/bin"
			}
			wantContains(t, out, "uid=1000(sandbox) gid=1000(sandbox) groups=1000(sandbox)\n", "sandbox\n", "owner sandbox\n",
				"account sandbox\n", wantPath+":"+tools+"/bin\n", "tool ran\n", "tools read-only\n")
			if strings.Count(out, "account ") != 1 {
				t.Errorf("host accounts of uid 1000 and above are visible:\n%s", out)
			}
			// A PATH the job chose is its own.
			_, out = run(t, create(t, b, defaultSpec()), "/bin/sh", "-c", `echo "PATH=$PATH"`)
			if out != "PATH=/usr/local/bin:/usr/bin:/bin\n" {
				t.Errorf("a job's own PATH was changed: %q", out)
			}
		})
	}
}

// TestToolDirsRefused: the tool directories New refuses, with the rule.
func TestToolDirsRefused(t *testing.T) {
	canRun(t)
	// Not under /tmp, which the sandbox has its own of.
	base := filepath.Join("/opt", "delegate-test-tooldirs-"+filepath.Base(t.TempDir()))
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	open := mk("open", 0o777)
	closed := mk("closed", 0o700)
	inside := filepath.Join(closed, "tool")
	os.Mkdir(inside, 0o755)
	link := filepath.Join(base, "link")
	os.Symlink(mk("real", 0o755), link)
	sandboxes := t.TempDir()
	for _, tc := range []struct{ dir, want string }{
		{"relative", "clean absolute path"},
		{"/", "host's root"},
		{"/workspace/x", "the sandbox has its own /workspace"},
		{"/tmp/x", "the sandbox has its own /tmp"},
		{sandboxes, "sandboxes of other jobs"},
		{open, "writable by neither all users"},
		{inside, "must be searchable by all users"},
		{link, "is a link"},
		{filepath.Join(base, "missing"), "no such file"},
	} {
		_, err := New(Config{Dir: sandboxes, ToolDirs: []string{tc.dir}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.dir, err, tc.want)
		}
	}
}
