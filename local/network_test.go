//go:build linux

package local

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/sandbox"
)

// netTools returns the network helpers installed here; the egress tests
// run once with each. Neither installed is a failure, not a skip: egress
// would go untested without anyone noticing.
func netTools(t *testing.T) []string {
	t.Helper()
	var tools []string
	for _, name := range []string{netToolPasta, netToolSlirp} {
		if _, err := exec.LookPath(name); err == nil {
			tools = append(tools, name)
		}
	}
	if len(tools) == 0 {
		t.Fatal("the network egress tests need pasta or slirp4netns and neither is installed: run ./scripts/test, which installs them (apt-get install passt slirp4netns)")
	}
	return tools
}

// netBackend returns a backend on a fresh directory that gives sandboxes
// with Network the helper tool.
func netBackend(t *testing.T, tool string) *Backend {
	t.Helper()
	b := newBackend(t, 0)
	b.nets.force = tool
	return b
}

func networkSpec() sandbox.Spec {
	s := defaultSpec()
	s.Network = true
	return s
}

// hostIPv4 returns the host's first non-loopback IPv4 address: a service
// there is outside the sandbox but not on the host's loopback.
func hostIPv4(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				return ipn.IP.String()
			}
		}
	}
	t.Fatal("this host has no non-loopback IPv4 address to test network egress against")
	return ""
}

// countingListener accepts TCP connections and reports each on accepted.
type countingListener struct {
	net.Listener
	accepted chan struct{}
}

func listenTCP(t *testing.T, addr string) *countingListener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cl := &countingListener{Listener: l, accepted: make(chan struct{}, 100)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			cl.accepted <- struct{}{}
			c.Close()
		}
	}()
	return cl
}

// gotConnection reports whether the listener accepted a connection within
// wait.
func (l *countingListener) gotConnection(wait time.Duration) bool {
	select {
	case <-l.accepted:
		return true
	case <-time.After(wait):
		return false
	}
}

// dialFromHost runs the dial helper on the host: the control that makes a
// failure inside the sandbox the sandbox's doing.
func dialFromHost(t *testing.T, addrs ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, addrs...)
	cmd.Env = []string{testHelperEnv + "=dial"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dial helper on the host: %v: %s", err, out)
	}
	return string(out)
}

// runningNetHelper waits until the sandbox's network helper is recorded
// and running, and returns its pid.
func runningNetHelper(t *testing.T, sb *sbox) int {
	t.Helper()
	var pid int
	if !waitFor(10*time.Second, func() bool {
		var alive bool
		pid, alive = netHelperAlive(sb.dir)
		return alive
	}) {
		t.Fatal("no running network helper was recorded")
	}
	return pid
}

// processGone reports whether pid has exited (a zombie has).
func processGone(pid int) bool {
	_, zombie, err := procStart(pid)
	return err != nil || zombie
}

func TestNetworkEgress(t *testing.T) {
	canRun(t)
	for _, tool := range netTools(t) {
		t.Run(tool, func(t *testing.T) {
			b := netBackend(t, tool)
			outside := listenTCP(t, net.JoinHostPort(hostIPv4(t), "0"))
			loopback := listenTCP(t, "127.0.0.1:0")
			_, loPort, _ := net.SplitHostPort(loopback.Addr().String())

			out := dialFromHost(t, outside.Addr().String(), loopback.Addr().String())
			if strings.Count(out, ": connected\n") != 2 || !outside.gotConnection(5*time.Second) || !loopback.gotConnection(5*time.Second) {
				t.Fatalf("control connections from the host failed:\n%s", out)
			}

			sb := create(t, b, networkSpec())
			if st := stateOf(t, sb); st.Network == nil || st.Network.Name != tool {
				t.Fatalf("state.Network = %+v, want %s", st.Network, tool)
			}
			// One job tries the host's own address (egress), then the
			// host's loopback service the ways the helpers could expose
			// it: the sandbox's 127.0.0.1 (pasta mirrors host ports there
			// by default) and the gateway (both translate it to the host's
			// 127.0.0.1 by default).
			targets := []string{outside.Addr().String(), "127.0.0.1:" + loPort, netGateway + ":" + loPort}
			exit, out := runHelperIn(t, sb, "dial", targets...)
			if exit.Code != 0 {
				t.Fatalf("exit %+v:\n%s", exit, out)
			}
			wantContains(t, out, "dial "+targets[0]+": connected\n", "dial "+targets[1]+": failed")
			if !outside.gotConnection(5 * time.Second) {
				t.Errorf("the listener on the host's address got no connection from the sandbox:\n%s", out)
			}
			// Whatever the gateway answered (on this network an outside
			// proxy may accept anything), it must not be the host's
			// loopback.
			if loopback.gotConnection(500 * time.Millisecond) {
				t.Errorf("the host's 127.0.0.1 listener accepted a connection from the sandbox:\n%s", out)
			}

			// The job has ended: so has its helper, and nothing is left in
			// the sandbox's cgroups.
			var rec netHelperRecord
			if err := readJSON(sb.path(fileNetHelper), &rec); err != nil || rec.Tool != tool || rec.PID <= 0 {
				t.Fatalf("helper record = %+v, %v", rec, err)
			}
			if !processGone(rec.PID) {
				t.Errorf("the %s process (pid %d) outlived the job", tool, rec.PID)
			}
			if pids, err := stateOf(t, sb).Cgroup.procs(); err != nil || len(pids) != 0 {
				t.Errorf("processes left in the sandbox's cgroups: %v %v", pids, err)
			}
		})
	}
}

func TestNetworkDNS(t *testing.T) {
	canRun(t)
	tools := netTools(t)
	// Resolution is only checked with a name the host itself resolves:
	// the resolver is the host's, beyond this test's control.
	name := func() string {
		for _, n := range []string{"deb.debian.org", "proxy.golang.org", "example.com"} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := net.DefaultResolver.LookupHost(ctx, n)
			cancel()
			if err == nil {
				return n
			}
		}
		return ""
	}()
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			b := netBackend(t, tool)
			// The file, then the options of its mount.
			exit, out := run(t, create(t, b, networkSpec()), "/bin/sh", "-c",
				`cat /etc/resolv.conf; while read -r id parent dev root mp opts rest; do [ "$mp" = /etc/resolv.conf ] && echo "$opts"; done < /proc/self/mountinfo; true`)
			if exit.Code != 0 || !strings.HasPrefix(out, netResolvConf+"ro,nosuid,nodev,noexec") {
				t.Errorf("exit %+v, output %q; want the generated resolv.conf on a read-only mount", exit, out)
			}
			if name == "" {
				t.Log("the host resolves none of the names tried; not checking resolution from the sandbox")
				return
			}
			exit, out = runHelperIn(t, create(t, b, networkSpec()), "resolve", name)
			if exit.Code != 0 || !strings.Contains(out, "resolved "+name+": ") {
				t.Errorf("resolve %s inside: exit %+v, output %q", name, exit, out)
			}
		})
	}

	// The file bound over is the same whatever the helper; what a template
	// has at /etc/resolv.conf is what varies.
	b := netBackend(t, tools[0])
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, etc string)
		want   string
		warned bool
	}{
		{"template with a link out of the sandbox", func(t *testing.T, etc string) {
			if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(etc, "resolv.conf")); err != nil {
				t.Fatal(err)
			}
		}, "nameserver " + netDNS + "\n", false},
		{"template with its own file", func(t *testing.T, etc string) {
			if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "nameserver " + netDNS + "\n", false},
		{"template without one", func(t *testing.T, etc string) {}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := buildRootfs(t)
			etc := filepath.Join(root, "etc")
			if err := os.Mkdir(etc, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, etc)
			spec := networkSpec()
			spec.Template = useRootfs(b, root)
			// dash builtins only: the template has nothing else.
			exit, out := run(t, create(t, b, spec), "/bin/sh", "-c",
				`while read -r l; do case "$l" in nameserver*) echo "$l";; esac; done < /etc/resolv.conf; echo done`)
			if exit.Code != 0 || !strings.HasSuffix(out, tc.want+"done\n") || strings.Contains(out, setupPrefix) != tc.warned {
				t.Errorf("exit %+v, output %q; want %q, a warning: %v", exit, out, tc.want, tc.warned)
			}
			if data, err := os.ReadFile(filepath.Join(etc, "resolv.conf")); err == nil && strings.Contains(string(data), netDNS) {
				t.Error("the template's resolv.conf was written to")
			}
		})
	}
}

func TestNetworkHelperLifecycle(t *testing.T) {
	canRun(t)
	for _, tool := range netTools(t) {
		t.Run(tool, func(t *testing.T) {
			b := netBackend(t, tool)
			ctx := context.Background()

			t.Run("in the cgroups, gone after Kill", func(t *testing.T) {
				sb := create(t, b, networkSpec())
				p := start(t, sb, "/bin/sh", "-c", "sleep 1000")
				pid := runningNetHelper(t, sb)
				if !waitFor(10*time.Second, func() bool {
					pids, _ := stateOf(t, sb).Cgroup.procs()
					return slices.Contains(pids, pid)
				}) {
					t.Error("the helper is not in the sandbox's cgroups")
				}
				if err := p.Kill(ctx); err != nil {
					t.Fatalf("Kill: %v", err)
				}
				if exit, _ := finish(t, p); !exit.Killed {
					t.Errorf("exit %+v, want Killed", exit)
				}
				if !processGone(pid) {
					t.Errorf("the helper (pid %d) survived Kill", pid)
				}
			})

			t.Run("gone after Destroy", func(t *testing.T) {
				sbi, err := b.Create(ctx, networkSpec())
				if err != nil {
					t.Fatal(err)
				}
				sb := sbi.(*sbox)
				st := stateOf(t, sb)
				start(t, sb, "/bin/sh", "-c", "sleep 1000")
				pid := runningNetHelper(t, sb)
				if err := b.Destroy(ctx, sb.id); err != nil {
					t.Fatalf("Destroy: %v", err)
				}
				if !processGone(pid) {
					t.Errorf("the helper (pid %d) survived Destroy", pid)
				}
				assertNoTrace(t, b, sb.id, st)
			})

			t.Run("gone with its shim", func(t *testing.T) {
				sb := create(t, b, networkSpec())
				start(t, sb, "/bin/sh", "-c", "sleep 1000")
				pid := runningNetHelper(t, sb)
				shim, err := readPID(sb.path(fileShimPID))
				if err != nil {
					t.Fatal(err)
				}
				syscall.Kill(shim, syscall.SIGKILL)
				if !waitFor(5*time.Second, func() bool { return processGone(pid) }) {
					t.Errorf("the helper (pid %d) outlived its shim", pid)
				}
			})

			// A restarted server finds the helper by its record, also one
			// that is not in the sandbox's cgroups (moved out here) and
			// whose shim cannot stop it (stopped here).
			for _, how := range []struct {
				name string
				end  func(t *testing.T, b2 *Backend, sb *sbox, execID string)
			}{
				{"Kill", func(t *testing.T, b2 *Backend, sb *sbox, execID string) {
					sb2, err := b2.Recover(ctx, sb.id)
					if err != nil {
						t.Fatal(err)
					}
					p, err := sb2.Process(ctx, execID)
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Kill(ctx); err != nil {
						t.Fatalf("Kill: %v", err)
					}
				}},
				{"Destroy", func(t *testing.T, b2 *Backend, sb *sbox, execID string) {
					if err := b2.Destroy(ctx, sb.id); err != nil {
						t.Fatalf("Destroy: %v", err)
					}
				}},
			} {
				t.Run("out of the cgroups, gone after "+how.name+" by a restarted server", func(t *testing.T) {
					if b.cg.Version != 1 {
						t.Skip("moving a process out of a cgroup v2 leaf needs a group that may hold one")
					}
					sb := create(t, b, networkSpec())
					p := start(t, sb, "/bin/sh", "-c", "sleep 1000")
					pid := runningNetHelper(t, sb)
					shim, err := readPID(sb.path(fileShimPID))
					if err != nil {
						t.Fatal(err)
					}
					syscall.Kill(shim, syscall.SIGSTOP)
					defer syscall.Kill(shim, syscall.SIGCONT)
					for _, d := range stateOf(t, sb).Cgroup.dirs() {
						if err := writeCgroupFile(filepath.Dir(d), "cgroup.procs", strconv.Itoa(pid)); err != nil {
							t.Fatal(err)
						}
					}
					// Once the helper is dead the shim may go on (and reap it).
					go func() {
						waitFor(20*time.Second, func() bool { return processGone(pid) })
						syscall.Kill(shim, syscall.SIGCONT)
					}()
					b2, err := New(Config{Dir: b.dir})
					if err != nil {
						t.Fatal(err)
					}
					how.end(t, b2, sb, p.ID())
					if !waitFor(2*time.Second, func() bool { return processGone(pid) }) {
						t.Errorf("the helper (pid %d) survived %s", pid, how.name)
					}
				})
			}
		})
	}
}

// TestNoNetworkByDefault: without Network nothing of the above happens.
func TestNoNetworkByDefault(t *testing.T) {
	b := newBackend(t, 0)
	sb := create(t, b, defaultSpec())
	if st := stateOf(t, sb); st.Network != nil {
		t.Errorf("state.Network = %+v without Network", st.Network)
	}
	exit, out := run(t, sb, "/bin/cat", "/etc/resolv.conf")
	host, _ := os.ReadFile("/etc/resolv.conf")
	if exit.Code != 0 || out != string(host) {
		t.Errorf("exit %+v, /etc/resolv.conf = %q; want the host's %q", exit, out, host)
	}
	if _, err := os.Stat(sb.path(fileNetHelper)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a network helper was recorded for a sandbox without network (%v)", err)
	}
}

// TestNetworkHelperMissing: without a helper, Create says what to install
// and leaves nothing behind; sandboxes without network are not affected.
func TestNetworkHelperMissing(t *testing.T) {
	b := newBackend(t, 0)
	b.nets.lookPath = func(string) (string, error) { return "", exec.ErrNotFound }
	if b.Capabilities().NetworkEgress {
		t.Error("Capabilities().NetworkEgress with no helper installed")
	}
	sb, err := b.Create(context.Background(), networkSpec())
	if err == nil {
		sb.Destroy(context.Background())
		t.Fatal("Create with Network succeeded without a helper")
	}
	for _, want := range []string{"pasta (apt-get install passt)", "slirp4netns (apt-get install slirp4netns)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to mention %q", err, want)
		}
	}
	if ids, _ := b.List(context.Background()); len(ids) != 0 {
		t.Errorf("the failed Create left sandboxes: %v", ids)
	}
	if exit, _ := run(t, create(t, b, defaultSpec()), "/bin/true"); exit.Code != 0 {
		t.Errorf("a sandbox without network: exit %+v", exit)
	}
}

// TestNetworkHelperFails: a helper that cannot set up the network stops
// the job before it starts, with the reason in its output.
func TestNetworkHelperFails(t *testing.T) {
	b := newBackend(t, 0)
	b.nets.lookPath = func(string) (string, error) { return "/bin/false", nil }
	for _, tool := range []string{netToolPasta, netToolSlirp} {
		t.Run(tool, func(t *testing.T) {
			b.nets.force = tool
			sb := create(t, b, networkSpec())
			exit, out := run(t, sb, "/bin/echo", "should not run")
			want := tool + " could not set up the sandbox's network: it exited (exit status 1)"
			if exit.Code != codeSetupFailed || !strings.HasPrefix(out, setupPrefix) || !strings.Contains(out, want) ||
				!strings.Contains(exit.Reason, want) || strings.Contains(out, "should not run") {
				t.Errorf("exit %+v, output %q; want code %d and %q", exit, out, codeSetupFailed, want)
			}
			if pids, err := stateOf(t, sb).Cgroup.procs(); err != nil || len(pids) != 0 {
				t.Errorf("processes left in the sandbox's cgroups: %v %v", pids, err)
			}
		})
	}
}

func TestFindNetTool(t *testing.T) {
	installed := func(names ...string) func(string) (string, error) {
		return func(name string) (string, error) {
			if slices.Contains(names, name) {
				return "/usr/bin/" + name, nil
			}
			return "", exec.ErrNotFound
		}
	}
	for _, tc := range []struct {
		name, force string
		have        []string
		want        string // "" for an error
	}{
		{"both: pasta", "", []string{netToolPasta, netToolSlirp}, netToolPasta},
		{"slirp4netns alone", "", []string{netToolSlirp}, netToolSlirp},
		{"pasta alone", "", []string{netToolPasta}, netToolPasta},
		{"neither", "", nil, ""},
		{"forced slirp4netns", netToolSlirp, []string{netToolPasta, netToolSlirp}, netToolSlirp},
		{"forced but missing", netToolSlirp, []string{netToolPasta}, ""},
		{"forced unknown", "vpnkit", []string{netToolPasta}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findNetTool(tc.force, installed(tc.have...))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %+v, want an error", got)
				}
				if tc.force == "" && !errors.Is(err, errNoNetTool) {
					t.Errorf("err = %v, want errNoNetTool", err)
				}
				return
			}
			if err != nil || got.Name != tc.want || got.Path != "/usr/bin/"+tc.want {
				t.Errorf("got %+v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// TestNetLook: Capabilities' look for a helper is reused for a while,
// for the same forced helper only; once stale, a helper installed since
// is found.
func TestNetLook(t *testing.T) {
	have := false
	looks := 0
	lookPath := func(name string) (string, error) {
		looks++
		if have {
			return "/usr/bin/" + name, nil
		}
		return "", exec.ErrNotFound
	}
	var l netLook
	steps := []struct {
		name      string
		force     string
		install   bool
		age       time.Duration // how old the last look is made
		wantLooks int           // lookPath calls so far
		wantFound bool
	}{
		{"first look", "", false, 0, 2, false},
		{"recent: reused", "", true, 0, 2, false},
		{"another helper forced", netToolSlirp, true, 0, 3, true},
		{"recent again", netToolSlirp, false, 0, 3, true},
		{"stale: looked again", netToolSlirp, false, netLookFor, 4, false},
	}
	for _, st := range steps {
		have = st.install
		l.at = l.at.Add(-st.age)
		err := l.find(st.force, lookPath)
		if looks != st.wantLooks || (err == nil) != st.wantFound {
			t.Errorf("%s: %d looks, err %v; want %d looks, found %v", st.name, looks, err, st.wantLooks, st.wantFound)
		}
	}
}

// TestNetHelperRecord: a record names one process, not whatever has its
// pid later.
func TestNetHelperRecord(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	file := filepath.Join(dir, fileNetHelper)
	if err := recordNetHelper(file, netToolSlirp, pid); err != nil {
		t.Fatal(err)
	}
	if got, alive := netHelperAlive(dir); !alive || got != pid {
		t.Fatalf("netHelperAlive = %d, %v; want %d, true", got, alive, pid)
	}
	// The same pid with another start time is another process.
	var rec netHelperRecord
	if err := readJSON(file, &rec); err != nil {
		t.Fatal(err)
	}
	rec.Start++
	if err := writeJSONAtomic(file, rec); err != nil {
		t.Fatal(err)
	}
	if _, alive := netHelperAlive(dir); alive {
		t.Error("a record with another start time matched the process")
	}
	killNetHelper(dir)
	if processGone(pid) {
		t.Fatal("killNetHelper killed a process whose start time does not match")
	}
	rec.Start--
	if err := writeJSONAtomic(file, rec); err != nil {
		t.Fatal(err)
	}
	if err := waitNetHelperGone(dir, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("sleep ended with %v, want killed", err)
	}
	if _, alive := netHelperAlive(t.TempDir()); alive {
		t.Error("a directory without a record has a live helper")
	}
}
