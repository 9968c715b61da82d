//go:build linux

package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// TestIsolation runs one probe per sandbox; each script prints a verdict
// the test checks, so a probe that cannot run fails rather than passes.
func TestIsolation(t *testing.T) {
	b := newBackend(t, 0)
	tmpName := fmt.Sprintf("delegate-isolation-%d", time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), tmpName)) })
	tests := []struct {
		name   string
		needs  string // host program the probe uses
		script string
		want   []string
	}{
		{
			name:   "root, /usr and /etc are read-only",
			script: `for f in /x /usr/x /etc/x /bin/x /root/x /home/x; do if touch $f 2>/dev/null; then echo "WROTE $f"; else echo "denied $f"; fi; done`,
			want:   []string{"denied /x\n", "denied /usr/x\n", "denied /etc/x\n", "denied /bin/x\n", "denied /root/x\n", "denied /home/x\n"},
		},
		{
			name:   "/workspace and /tmp are writable",
			script: `echo a > /workspace/f && echo a > /tmp/f && echo a > /dev/shm/f && echo writable`,
			want:   []string{"writable\n"},
		},
		{
			name:   "private /tmp",
			script: `echo secret > /tmp/` + tmpName + ` && echo written`,
			want:   []string{"written\n"},
		},
		{
			name:   "host /root and /home are not visible",
			script: `echo "root:[$(ls -A /root 2>&1)] home:[$(ls -A /home 2>&1)]"`,
			want:   []string{"root:[] home:[]\n"},
		},
		{
			name: "host state and private directories are not there",
			// /run holds only the job's status channel, not the host's /run.
			script: `for d in ` + b.dir + ` /var /opt /srv /mnt /media /sys; do if [ -e $d ]; then echo "SEEN $d"; else echo "absent $d"; fi; done; echo "run: $(find /run | tr '\n' ' ')"`,
			want: []string{"absent " + b.dir + "\n", "absent /var\n", "absent /opt\n", "absent /mnt\n", "absent /sys\n",
				"run: /run /run/delegate /run/delegate/status \n"},
		},
		{
			name:   "host root's files are nobody's",
			script: `stat -c '%U' /etc/passwd; if cat /etc/shadow >/dev/null 2>&1; then echo "READ shadow"; else echo "shadow denied"; fi`,
			want:   []string{"nobody\n", "shadow denied\n"},
		},
		{
			name:   "uid 1000, no capabilities, no_new_privs, seccomp",
			script: `id -u; id -g; echo "groups=[$(id -G)]"; grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status`,
			want: []string{"1000\n1000\n", "Uid:\t1000\t1000\t1000\t1000\n", "Gid:\t1000\t1000\t1000\t1000\n", "groups=[1000]\n",
				"CapInh:\t0000000000000000\n", "CapPrm:\t0000000000000000\n", "CapEff:\t0000000000000000\n",
				"CapBnd:\t0000000000000000\n", "CapAmb:\t0000000000000000\n", "NoNewPrivs:\t1\n", "Seccomp:\t2\n"},
		},
		{
			name: "own pid namespace",
			// The words of pid 1's command line (the C init's is padded
			// with NULs where the shim's, naming a host path, was). A
			// handful of processes, not the host's hundreds: init, its
			// spare, the shell, its command substitution, ls and grep,
			// and for a moment a spare being replaced (7 seen once, under
			// a load of 40).
			script: `set -- $(tr '\0' ' ' < /proc/1/cmdline); echo "pid1=$*"; n=$(ls /proc | grep -c '^[0-9]'); if [ $n -le 8 ]; then echo few; else echo "SEEN $n processes"; fi`,
			want:   []string{"pid1=delegate-sandbox-init " + initCommand + "\n", "few\n"},
		},
		{
			name:   "hostname",
			script: `hostname`,
			want:   []string{"sandbox\n"},
		},
		{
			name:   "unshare fails",
			needs:  "unshare",
			script: `unshare -U true 2>&1; echo "rc=$?"; unshare -m true 2>&1; echo "rc=$?"`,
			want:   []string{"Operation not permitted", "rc=1\n"},
		},
		{
			name:   "mount fails",
			needs:  "mount",
			script: `mount -t tmpfs x /tmp 2>&1; echo "rc=$?"`,
			want:   []string{"rc=32\n"},
		},
		{
			name:   "minimal /dev",
			script: `ls /dev | tr '\n' ' '; echo; echo x > /dev/null && head -c 4 /dev/urandom | wc -c`,
			want:   []string{"fd full null random shm stderr stdin stdout tty urandom zero \n", "4\n"},
		},
	}
	// Each probe runs in a fresh sandbox, and as the second and third
	// command of a kept one (Spec.MultiExec): a command of a kept sandbox
	// is built from the same plan, so it must be as confined.
	kept := func(t *testing.T) *sbox {
		spec := defaultSpec()
		spec.MultiExec, spec.Expires = true, time.Now().Add(time.Minute)
		sb := create(t, b, spec)
		if exit, out := run(t, sb, "/bin/sh", "-c", "echo first > /workspace/first"); exit.Code != 0 {
			t.Fatalf("first command: %+v %s", exit, out)
		}
		return sb
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needs != "" {
				if _, err := exec.LookPath(tt.needs); err != nil {
					t.Skipf("%s is not installed on this host", tt.needs)
				}
			}
			check := func(how string, exit sandbox.Exit, out string) {
				t.Helper()
				if exit.Code != 0 {
					t.Errorf("%s: exit = %+v", how, exit)
				}
				wantContains(t, out, tt.want...)
				if strings.Contains(out, "WROTE") || strings.Contains(out, "SEEN") || strings.Contains(out, "READ") {
					t.Errorf("%s: isolation breach:\n%s", how, out)
				}
			}
			exit, out := sh(t, b, tt.script)
			check("fresh sandbox", exit, out)
			sb := kept(t)
			for _, how := range []string{"second command of a kept sandbox", "third command of a kept sandbox"} {
				exit, out := run(t, sb, "/bin/sh", "-c", tt.script)
				check(how, exit, out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(os.TempDir(), tmpName)); err == nil {
		t.Errorf("the job's /tmp file appeared in the host's %s", os.TempDir())
	}
}

func TestSeccompFromInside(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	exit, out := runHelperIn(t, sb, "syscalls")
	if exit.Code != 0 {
		t.Fatalf("exit %+v:\n%s", exit, out)
	}
	wantContains(t, out,
		"unshare=operation not permitted\n",
		"mount=operation not permitted\n",
		"keyctl=operation not permitted\n",
		"ptrace=operation not permitted\n",
		"bpf=operation not permitted\n",
		"clone3=function not implemented\n",
		"x32=operation not permitted\n",
		"clone-newuser=fork/exec /bin/true: operation not permitted\n",
		"clone-plain=ok\n")
}

func TestNetwork(t *testing.T) {
	b := newBackend(t, 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	addr := l.Addr().String()

	// The same helper reaches the listener from the host, so a failure
	// inside is the sandbox's doing, not the helper's.
	self, _ := os.Executable()
	cmd := exec.Command(self, addr)
	cmd.Env = []string{testHelperEnv + "=connect"}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "connected") {
		t.Fatalf("control connection from the host failed: %v: %s", err, out)
	}
	<-accepted

	for _, target := range []string{addr, "1.1.1.1:53", "[::1]:22"} {
		exit, out := runHelperIn(t, create(t, b, defaultSpec()), "connect", target)
		if exit.Code != 1 || !strings.Contains(out, "connect failed") {
			t.Errorf("connect %s from inside: exit %+v, output %q; want a failure", target, exit, out)
		}
	}
	select {
	case <-accepted:
		t.Error("the host's listener accepted a connection from the sandbox")
	default:
	}

	exit, out := runHelperIn(t, create(t, b, defaultSpec()), "loopback")
	if exit.Code != 0 || !strings.Contains(out, "loopback pong <nil>") {
		t.Errorf("loopback inside: exit %+v, output %q", exit, out)
	}
}

// TestKeptSandboxesApart: two kept sandboxes, each with a command's
// background process, cannot see each other's processes, files, /tmp,
// loopback or abstract sockets, nor signal each other.
func TestKeptSandboxesApart(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed on this host")
	}
	b := newBackend(t, 0)
	keptBox := func() *sbox {
		spec := defaultSpec()
		spec.MultiExec, spec.Expires = true, time.Now().Add(time.Minute)
		return create(t, b, spec)
	}
	a, other := keptBox(), keptBox()
	// A leaves a sleep, a TCP listener on loopback and an abstract socket
	// behind, and files in /workspace and /tmp.
	serve := `import socket, os, time
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind(("127.0.0.1", 7781)); t.listen()
u = socket.socket(socket.AF_UNIX); u.bind("\0delegate-apart"); u.listen()
open("/tmp/ready", "w").write("ready")
time.sleep(300)
`
	if err := a.WriteFile(context.Background(), "/workspace/serve.py", []byte(serve), 0o644); err != nil {
		t.Fatal(err)
	}
	exit, out := run(t, a, "/bin/sh", "-c", `sleep 300 >/dev/null 2>&1 &
python3 /workspace/serve.py >/dev/null 2>&1 &
echo mine > /workspace/a.txt
for i in $(seq 100); do [ -e /tmp/ready ] && break; sleep 0.05; done; cat /tmp/ready`)
	if exit.Code != 0 || !strings.Contains(out, "ready") {
		t.Fatalf("A: %+v %s", exit, out)
	}
	probe := `import socket, os
def connect(fam, addr):
    s = socket.socket(fam)
    s.settimeout(2)
    try:
        s.connect(addr); return "CONNECTED"
    except OSError as e:
        return "refused"
print("tcp", connect(socket.AF_INET, ("127.0.0.1", 7781)))
print("abstract", connect(socket.AF_UNIX, "\0delegate-apart"))
cmds = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try: cmds.append(open("/proc/%s/cmdline" % p).read().replace("\0", " "))
        except OSError: pass
print("sleep seen" if any("sleep 300" in c or "serve.py" in c for c in cmds) else "no sleep")
print("files", sorted(os.listdir("/workspace")), sorted(os.listdir("/tmp")))
`
	if err := other.WriteFile(context.Background(), "/workspace/probe.py", []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	exit, out = run(t, other, "/bin/sh", "-c", `python3 /workspace/probe.py; kill -9 -1 2>/dev/null; echo killed-all`)
	if exit.Code != 0 && !strings.Contains(out, "killed-all") {
		t.Fatalf("B: %+v %s", exit, out)
	}
	wantContains(t, out, "tcp refused\n", "abstract refused\n", "no sleep\n", "files ['probe.py'] []\n")
	// A's server outlived B's kill of everything it could signal.
	exit, out = run(t, a, "/bin/sh", "-c", `python3 -c '
import socket; s = socket.socket(); s.connect(("127.0.0.1", 7781)); print("serving")'`)
	if exit.Code != 0 {
		t.Fatalf("A after B: %+v %s", exit, out)
	}
	wantContains(t, out, "serving\n")
}
