package pvesim

import (
	"context"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/sandbox"
)

func TestQGAProto(t *testing.T) {
	ctx := context.Background()
	b, err := local.New(local.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(ctx, sandbox.Spec{JobID: "vm-100", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(ctx, sb.ID())
	t0 := time.Now()
	a, err := startAgent(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("agent up", time.Since(t0))
	t0 = time.Now()
	if err := a.ping(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log("ping", time.Since(t0))
	pid, err := a.exec(ctx, []string{"/bin/sh", "-c", "echo hi; echo err >&2; id; pwd; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		st, err := a.execStatus(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited {
			t.Logf("%+v %d out=%q err=%q", st, *st.ExitCode, st.Out, st.Err)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = a.exec(ctx, []string{"nosuch"}, nil)
	t.Log(err)
	t.Log(a.fileWrite(ctx, "/etc/x", []byte("x")))
	t.Log(a.fileWrite(ctx, "/tmp/x", []byte("hello")))
	d, err := a.fileRead(ctx, "/tmp/x", 0, 100)
	t.Logf("%q %v", d, err)
	_, err = a.fileRead(ctx, "/nonexist", 0, 100)
	t.Log(err)
	_, err = a.fileRead(ctx, "/etc", 0, 100)
	t.Log(err)
	pid, _ = a.exec(ctx, []string{"cat"}, []byte("stdin data"))
	time.Sleep(100 * time.Millisecond)
	st, _ := a.execStatus(ctx, pid)
	t.Logf("%+v out=%q", st, st.Out)
	pid, _ = a.exec(ctx, []string{"sh", "-c", "kill -9 $$"}, nil)
	time.Sleep(100 * time.Millisecond)
	st, _ = a.execStatus(ctx, pid)
	t.Logf("%+v sig=%v", st, st.Signal)
}
