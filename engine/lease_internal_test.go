package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
)

// TestKeptElsewhere: a command for a local kept sandbox is refused on a
// server of another host, naming the server that holds it and where it
// serves (or that it is gone; one registered since the last read of the
// leases is not); on its own host it goes on.
func TestKeptElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := testkit.OpenStore(t)
	l := newLeaser(Leases{TTL: time.Minute, HostID: "host-a"}, store, discardLogger, "here/1/2/3", "local", func(string) bool { return true })
	if err := l.register(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []delegate.Server{{ID: "b/1/2/3", Host: "b", HostID: "host-b", Addr: "10.0.0.2:8080"}, {ID: "gone/1/2/3", Host: "c", HostID: "host-c"}} {
		if _, err := store.RegisterServer(ctx, s, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.ExpireServer(ctx, "gone/1/2/3"); err != nil {
		t.Fatal(err)
	}
	l.refresh(ctx)
	// One that registers after this server last read the leases.
	if _, err := store.RegisterServer(ctx, delegate.Server{ID: "late/1/2/3", Host: "d", HostID: "host-d", Addr: "http://10.0.0.4:8080"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sb   delegate.Sandbox
		want string // "" : not refused
	}{
		{delegate.Sandbox{ID: "sb-1", Backend: "local", Owner: "b/1/2/3"}, "sandbox sb-1 is a local sandbox on host b, held by server b/1/2/3 (10.0.0.2:8080): send the command to that server"},
		{delegate.Sandbox{ID: "sb-2", Backend: "local", Owner: "gone/1/2/3"}, "sandbox sb-2 is a local sandbox on host c, whose server gone/1/2/3 is gone"},
		{delegate.Sandbox{ID: "sb-5", Backend: "local", Owner: "late/1/2/3"}, "sandbox sb-5 is a local sandbox on host d, held by server late/1/2/3 (http://10.0.0.4:8080)"},
		{delegate.Sandbox{ID: "sb-3", Backend: "local", Owner: "here/1/2/3"}, ""},
		{delegate.Sandbox{ID: "sb-4", Backend: "proxmox", Owner: "b/1/2/3"}, ""},
	} {
		holder, refusal := keptElsewhere(ctx, l, &c.sb)
		var err error
		if refusal != nil {
			err = refusal
		}
		if forwardable := holder != nil; forwardable != strings.Contains(c.want, "held by server") {
			t.Errorf("%s: holder %v", c.sb.ID, holder)
		}
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "manifest.sandbox")) {
			t.Errorf("%s: %v, want %q", c.sb.ID, err, c.want)
		}
	}
}
