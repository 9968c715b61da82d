package proxmox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestConcurrentStatusChannels (issue 39, 7): two commands running at
// once in one VM each have their status channel: each one's status lines
// are its own, all of them; and once a command's result is read, its
// directory in the guest is gone.
func TestConcurrentStatusChannels(t *testing.T) {
	t.Parallel()
	_, sb := keptSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	script := func(name string) string {
		return `for i in 1 2 3 4; do echo "` + name + `$i" >"$DELEGATE_STATUS_FILE"; sleep 0.3; done`
	}
	events := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range []string{"A", "B"} {
		execed := make(chan struct{})
		wg.Go(func() {
			p, err := sb.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", script(name)},
				Env: []string{"PATH=/usr/bin:/bin", "DELEGATE_STATUS_FILE=" + proxmox.StatusFile}})
			close(execed)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := p.Wait(ctx); err != nil {
				t.Error(err)
				return
			}
			var ev []byte
			for {
				b, err := p.ReadEvents(ctx, int64(len(ev)), 1<<16)
				if err != nil {
					t.Error(err)
					return
				}
				if len(b) == 0 {
					break
				}
				ev = append(ev, b...)
			}
			if _, err := p.ReadOutput(ctx, 0, 1<<16); err != nil {
				t.Error(err)
			}
			mu.Lock()
			events[name] = string(ev)
			mu.Unlock()
		})
		<-execed // B starts while A runs (for 1.2 s)
	}
	wg.Wait()
	for _, name := range []string{"A", "B"} {
		want := name + "1\n" + name + "2\n" + name + "3\n" + name + "4\n"
		if events[name] != want {
			t.Errorf("command %s's status lines %q, want %q", name, events[name], want)
		}
	}
	_, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "ls -d /var/tmp/delegate/cmd-*.d"}})
	if n := len(strings.Fields(out)); n != 1 {
		t.Errorf("the commands' directories left in the guest: %q (want only the running one's)", out)
	}
}

// TestReadAfterClean: once a command's result was read and its directory
// removed, reading on from its end answers nothing, without an error.
func TestReadAfterClean(t *testing.T) {
	t.Parallel()
	_, sb := keptSandbox(t)
	ctx := context.Background()
	exit, p := runProc(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo done"}})
	if exit.Code != 0 {
		t.Fatalf("exit %+v", exit)
	}
	out, err := p.ReadOutput(ctx, 0, 1<<16)
	if err != nil || string(sandbox.Join(out)) != "done\n" {
		t.Fatalf("output %q %v", sandbox.Join(out), err)
	}
	for range 2 { // to the end of both: the directory goes
		if o, err := p.ReadOutput(ctx, 5, 1<<16); err != nil || len(o) != 0 {
			t.Fatalf("output at its end: %q %v", sandbox.Join(o), err)
		}
		if ev, err := p.ReadEvents(ctx, 0, 1<<16); err != nil || len(ev) != 0 {
			t.Fatalf("events: %q %v", ev, err)
		}
	}
}

// keptSandbox is a VM made for many commands (a kept sandbox's).
func keptSandbox(t *testing.T) (*proxmox.Backend, sandbox.Instance) {
	t.Helper()
	return vmSpec(t, proxmox.Config{}, sandbox.Spec{JobID: "sbx-status", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, MultiExec: true})
}

// TestOneCommandVMNotCleaned: a VM made for one command is destroyed
// after it, its command's directory with it: removing the directory first
// would cost calls for nothing.
func TestOneCommandVMNotCleaned(t *testing.T) {
	t.Parallel()
	_, sb := vm(t)
	_, p := runProc(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo once"}})
	ctx := context.Background()
	for range 2 {
		if _, err := p.ReadOutput(ctx, 5, 1<<16); err != nil {
			t.Fatal(err)
		}
		if _, err := p.ReadEvents(ctx, 0, 1<<16); err != nil {
			t.Fatal(err)
		}
	}
	if _, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "ls -d /var/tmp/delegate/cmd-*.d | wc -l"}}); strings.TrimSpace(out) != "2" {
		t.Errorf("command directories: %q, want the first one's and this one's", out)
	}
}
