package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/storetest"
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
		holder, refusal := keptElsewhere(ctx, l, &c.sb, "manifest.sandbox")
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

// TestLeaseEndHeardFirst: a server that hears of its job's end before its
// own run of the job writes again (another server adopted the job and
// ended it) keeps its fence: that write is refused as fenced, counted,
// and the job given up, as when the write comes first. A job that ended
// under this server's own fence is forgotten. (It forgot both, and the
// write went unfenced: TestLeaseRetriesProvisioning waited in vain for
// the fenced write when the end came first, under load.)
func TestLeaseEndHeardFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		adopted bool
	}{{"adopted and ended by another", true}, {"ended by its owner", false}} {
		t.Run(c.name, func(t *testing.T) {
			store := testkit.OpenStore(t)
			a := newLeaser(Leases{TTL: time.Minute, HostID: "host-a"}, store, discardLogger, "a/1/2/3", "mock", func(string) bool { return true })
			var gaveUp []string
			a.giveUp = func(id string) { gaveUp = append(gaveUp, id) }
			if err := a.register(ctx); err != nil {
				t.Fatal(err)
			}
			job := storetest.NewJob("job-1")
			job.Status, job.Owner, job.Epoch = delegate.StatusRunning, a.me.ID, 1
			if err := store.CreateJob(ctx, job); err != nil {
				t.Fatal(err)
			}
			a.hold(job.ID, job.Epoch)
			endAs := delegate.Fence{Owner: a.me.ID, Epoch: 1}
			if c.adopted {
				if _, err := store.RegisterServer(ctx, delegate.Server{ID: "b/1/2/3", HostID: "host-a"}, time.Minute); err != nil {
					t.Fatal(err)
				}
				if err := store.ExpireServer(ctx, a.me.ID); err != nil {
					t.Fatal(err)
				}
				adopted, err := store.AdoptJobs(ctx, "b/1/2/3", []string{a.me.ID}, 10)
				if err != nil || len(adopted) != 1 {
					t.Fatalf("adopted %+v, %v", adopted, err)
				}
				endAs = delegate.Fence{Owner: "b/1/2/3", Epoch: adopted[0].Job.Epoch}
			}
			ended, err := store.UpdateJob(delegate.WithFence(ctx, endAs), job.ID, func(j *delegate.Job) error {
				j.Status = delegate.StatusSuccess
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			a.release(ended) // heard before a's run writes again
			fenced, err := a.fence(ctx, job.ID)
			if err == nil {
				_, err = store.UpdateJob(fenced, job.ID, func(j *delegate.Job) error { j.Progress = "a's run"; return nil })
			}
			a.refused(job.ID, err)
			st := a.stats()
			if c.adopted && (!errors.Is(err, delegate.ErrFenced) || st.FencedWrites != 1 || !slices.Equal(gaveUp, []string{job.ID})) {
				t.Errorf("a's write after the adopter ended the job: %v; fenced writes %d, given up %v", err, st.FencedWrites, gaveUp)
			}
			if _, held := delegate.FenceOf(fenced); !c.adopted && (held || st.FencedWrites != 0 || len(gaveUp) != 0) {
				t.Errorf("a's job ended under its own fence is still held: %v; fenced writes %d, given up %v", err, st.FencedWrites, gaveUp)
			}
		})
	}
}
