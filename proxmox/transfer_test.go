package proxmox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// guestCallback is where job VMs reach the callback server in these
// tests (the simulator carries it to the test's server).
const guestCallback = "10.0.0.7:8765"

// xferRig is a simulated cluster, a backend whose job VMs reach its
// callback server (serving its Transfers) at guestCallback, and what
// that server was asked.
type xferRig struct {
	sim  *pvesim.Server
	b    *proxmox.Backend
	logs *logBuffer

	mu   sync.Mutex
	reqs []string // "GET 200", "PUT 204"...
}

// newXferRig: reach says whether the guests' network carries
// guestCallback to the server; transferURL is the backend's.
func newXferRig(t *testing.T, reach bool, transferURL string, tune ...func(*proxmox.Config)) *xferRig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rig := &xferRig{logs: &logBuffer{}}
	rig.sim = newSim(t, pvesim.DefaultNodes(1), func(o *pvesim.Options) {
		o.CallbackPort = 8765
		if reach {
			o.Hosts = map[string]string{guestCallback: ln.Addr().String()}
		}
	})
	c, _ := client(t, rig.sim, "delegate@pve", pvesim.RoleAdministrator)
	cfg := proxmox.Config{Template: "debian-job", PollInterval: 100 * time.Millisecond, TransferURL: transferURL, Logger: rig.logs.logger()}
	for _, f := range tune {
		f(&cfg)
	}
	rig.b, err = proxmox.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	svcs := httpapi.Services{}
	if x := rig.b.Transfers(); x != nil {
		svcs.Transfers = x
	}
	srv := httpapi.CallbackServer(svcs, httpapi.Options{})
	next := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(cw, r)
		rig.mu.Lock()
		rig.reqs = append(rig.reqs, fmt.Sprintf("%s %d", r.Method, cw.code))
		rig.mu.Unlock()
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return rig
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (rig *xferRig) served() []string {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return append([]string(nil), rig.reqs...)
}

// vm makes a VM, with a NIC or without.
func (rig *xferRig) vm(t *testing.T, nic bool) sandbox.Instance {
	t.Helper()
	sb, err := rig.b.Create(context.Background(), sandbox.Spec{JobID: "job-xfer", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, Network: nic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	return sb
}

// agentCalls counts the simulator's agent calls from request from on:
// all of them, and the calls that are not a poll of a command's status
// (execs, file-writes, file-reads...), whose number does not depend on
// how long the guest's work took; and lists the files agent/file-write
// wrote and agent/file-read read.
func agentCalls(sim *pvesim.Server, from int) (all, calls int, writes, reads []string) {
	for _, r := range sim.Requests()[from:] {
		if !strings.Contains(r.Path, "/agent/") {
			continue
		}
		all++
		if !strings.HasSuffix(r.Path, "/agent/exec-status") {
			calls++
		}
		switch {
		case strings.HasSuffix(r.Path, "/agent/file-write"):
			writes = append(writes, fmt.Sprint(r.Params["file"]))
		case strings.HasSuffix(r.Path, "/agent/file-read"):
			reads = append(reads, fmt.Sprint(r.Params["file"]))
		}
	}
	return all, calls, writes, reads
}

// randomTree writes n files of size bytes each, random (so the archive
// is as large as the files), and returns their sha256 by name.
func randomTree(t *testing.T, n, size int) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(7, uint64(n)))
	sums := map[string]string{}
	for i := range n {
		data := make([]byte, size)
		for j := 0; j+8 <= len(data); j += 8 {
			v := r.Uint64()
			for k := range 8 {
				data[j+k] = byte(v >> (8 * k))
			}
		}
		name := fmt.Sprintf("blob%02d.bin", i)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		sums[name] = hex.EncodeToString(sum[:])
	}
	return dir, sums
}

// putTree copies dir into the VM as the engine does (Scan, Archive with
// gzip, PutArchive) and returns the baseline.
func putTree(t *testing.T, sb sandbox.Instance, dir string) *workspace.Baseline {
	t.Helper()
	ctx := context.Background()
	tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	var base *workspace.Baseline
	archived := make(chan error, 1)
	go func() {
		var err error
		base, err = tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: true})
		pw.CloseWithError(err)
		archived <- err
	}()
	_, err = sb.(sandbox.Archiver).PutArchive(ctx, pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if aerr := <-archived; aerr != nil || err != nil {
		t.Fatalf("put: %v (archive: %v)", err, aerr)
	}
	return base
}

// guestSums are the sha256 sums of the workspace's blobs in the guest.
func guestSums(t *testing.T, sb sandbox.Instance) map[string]string {
	t.Helper()
	exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "cd /workspace && sha256sum blob*"}, OutputLimit: 1 << 20})
	if exit.Code != 0 {
		t.Fatalf("sha256sum: %+v %s", exit, out)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if sum, name, ok := strings.Cut(line, "  "); ok {
			sums[name] = sum
		}
	}
	return sums
}

// getChanges reads the VM's workspace back as the engine does.
func getChanges(t *testing.T, sb sandbox.Instance, base *workspace.Baseline) *workspace.Changes {
	t.Helper()
	ctx := context.Background()
	rc, err := sb.(sandbox.Archiver).GetArchive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := workspace.ReadChanges(ctx, base, rc, workspace.ChangesOptions{MaxBytes: 64 << 20})
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("close: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// leftovers lists what of delegate's transfers is left in the guest: in
// the workspace and in /var/tmp/delegate; and anything at all in /tmp.
func leftovers(t *testing.T, sb sandbox.Instance) string {
	t.Helper()
	_, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "ls -a /workspace /var/tmp/delegate | grep -e delegate-xfer -e '^ws-' -e '^out-' -e '^files-'; find /tmp -mindepth 1; true"}, OutputLimit: 1 << 20})
	return strings.TrimSpace(out)
}

// tmpRe finds /tmp (not /var/tmp) in what the backend asked the agent.
var tmpRe = regexp.MustCompile(`(^|[^r])/tmp(/|\b)`)

// namedTmp lists the agent calls from request from on that name the
// guest's /tmp (a file written or read, an argument of a command): on
// Debian 13 /tmp is RAM, half the VM's memory (pvesim TestGuestTmp), so
// no transfer may go there (issue 39, item 7).
func namedTmp(sim *pvesim.Server, from int) []string {
	var named []string
	for _, r := range sim.Requests()[from:] {
		if !strings.Contains(r.Path, "/agent/") {
			continue
		}
		for k, v := range r.Params {
			if k != "input-data" && tmpRe.MatchString(fmt.Sprint(v)) {
				named = append(named, fmt.Sprintf("%s %s=%v", r.Path, k, v))
			}
		}
	}
	return named
}

// TestWorkspaceOverHTTP (issue 39, 14): a VM with a network fetches a
// 12 MB workspace (random: 12 MB compressed too, some 270 file-writes
// through the agent) from the callback server with curl, in a handful
// of agent calls, and sends its changes back the same way (a PUT, no
// agent/file-read); both arrive whole, nothing is left in the guest.
func TestWorkspaceOverHTTP(t *testing.T) {
	t.Parallel()
	rig := newXferRig(t, true, "http://"+guestCallback)
	sb := rig.vm(t, true)
	dir, sums := randomTree(t, 6, 2<<20)

	n0 := len(rig.sim.Requests())
	base := putTree(t, sb, dir)
	all, calls, writes, _ := agentCalls(rig.sim, n0)
	t.Logf("12 MB in: %d agent calls (%d of them polls)", all, all-calls)
	if calls != 2 || len(writes) > 0 {
		t.Errorf("12 MB in: %d agent calls but polls, %d file-writes (over HTTP: two execs, the fetch and the unpacking); log:\n%s", calls, len(writes), rig.logs)
	}
	if got := rig.served(); len(got) != 1 || got[0] != "GET 200" {
		t.Errorf("the callback server served %v, want one GET", got)
	}
	if got := guestSums(t, sb); fmt.Sprint(got) != fmt.Sprint(sums) {
		t.Errorf("in the guest %v, sent %v", got, sums)
	}

	// Changes: one blob rewritten in the guest (10 MB, random), one removed.
	exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c",
		"cd /workspace && head -c 10485760 /dev/urandom > blob00.bin && rm blob01.bin && sha256sum blob00.bin"}, OutputLimit: 1 << 20})
	if exit.Code != 0 {
		t.Fatalf("change: %+v %s", exit, out)
	}
	newSum, _, _ := strings.Cut(out, " ")
	n1 := len(rig.sim.Requests())
	cs := getChanges(t, sb, base)
	all, calls, _, reads := agentCalls(rig.sim, n1)
	t.Logf("changes out: %d agent calls (%d of them polls)", all, all-calls)
	if calls != 2 || len(reads) > 0 {
		t.Errorf("changes out: %d agent calls but polls, file-reads %v (over HTTP: two execs, the packing and the sending)", calls, reads)
	}
	if got := rig.served(); len(got) != 2 || got[1] != "PUT 204" {
		t.Errorf("the callback server served %v, want a GET and a PUT", got)
	}
	if cs.Modified != 1 || cs.Deleted != 1 || cs.Added != 0 {
		t.Errorf("changes %+v", cs)
	}
	for _, c := range cs.Changes {
		if c.Path == "blob00.bin" {
			sum := sha256.Sum256(c.New.Data)
			if hex.EncodeToString(sum[:]) != newSum || c.New.SHA256 != newSum {
				t.Errorf("blob00.bin came back as %x (%d bytes, %s), the guest's is %s", sum, len(c.New.Data), c.New.SHA256, newSum)
			}
		}
	}
	if left := leftovers(t, sb); left != "" {
		t.Errorf("left in the guest: %s", left)
	}
	if named := namedTmp(rig.sim, n0); len(named) > 0 {
		t.Errorf("the workspace's transfers used the guest's /tmp (RAM): %v", named)
	}
}

// TestWorkspaceHTTPFallback (issue 39, 14): where the guest cannot reach
// the callback server (its network does not route there) or has no NIC,
// the workspace goes through the agent, whole, and the log says why;
// its parts and packed archive are on the workspace's file system, not
// in the guest's /tmp (RAM on Debian 13), and gone afterwards (issue 39,
// 7).
func TestWorkspaceHTTPFallback(t *testing.T) {
	t.Parallel()
	rig := newXferRig(t, false, "http://"+guestCallback)
	dir, sums := randomTree(t, 2, 100<<10)
	for _, nic := range []bool{true, false} {
		t.Run(fmt.Sprintf("nic=%v", nic), func(t *testing.T) {
			sb := rig.vm(t, nic)
			n0 := len(rig.sim.Requests())
			base := putTree(t, sb, dir)
			_, _, writes, _ := agentCalls(rig.sim, n0)
			if len(writes) < 5 {
				t.Errorf("file-writes %v: the archive did not go through the agent", writes)
			}
			for _, f := range writes {
				if !strings.HasPrefix(f, "/workspace/.delegate-xfer-") {
					t.Errorf("an archive's part written to %s, not beside the workspace", f)
				}
			}
			if got := guestSums(t, sb); fmt.Sprint(got) != fmt.Sprint(sums) {
				t.Errorf("in the guest %v, sent %v", got, sums)
			}
			if exit, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c", "echo changed >> /workspace/blob01.bin"}}); exit.Code != 0 {
				t.Fatalf("%+v %s", exit, out)
			}
			if cs := getChanges(t, sb, base); cs.Modified != 1 {
				t.Errorf("changes %+v", cs)
			}
			if left := leftovers(t, sb); left != "" {
				t.Errorf("left in the guest: %s", left)
			}
			if named := namedTmp(rig.sim, n0); len(named) > 0 {
				t.Errorf("the workspace's transfers used the guest's /tmp (RAM): %v", named)
			}
		})
	}
	if got := rig.served(); len(got) != 0 {
		t.Errorf("the callback server served %v", got)
	}
	logs := rig.logs.String()
	if !strings.Contains(logs, `msg="workspace in through the guest agent"`) || !strings.Contains(logs, "could not reach http://"+guestCallback) ||
		!strings.Contains(logs, `msg="workspace out through the guest agent"`) {
		t.Errorf("the log does not say why the workspace went through the agent:\n%s", logs)
	}
}

// TestForkOverHTTP (issue 38): where a kept sandbox and its fork have a
// network (a fork of a sandbox with one has one too), the checkpoint's
// archive comes out of the source and goes into the fork over HTTP, a
// few agent calls each whatever its size: no agent/file-read, no
// agent/file-write; the fork has the source's files.
func TestForkOverHTTP(t *testing.T) {
	t.Parallel()
	rig := newXferRig(t, true, "http://"+guestCallback, func(c *proxmox.Config) { c.CheckpointDir = t.TempDir() })
	ctx := context.Background()
	spec := sandbox.Spec{JobID: "sbx-xfersrc", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, Network: true, MultiExec: true}
	src, err := rig.b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Destroy(context.Background()) })
	dir, sums := randomTree(t, 3, 1<<20)
	putTree(t, src, dir)

	n0 := len(rig.sim.Requests())
	cp, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec.JobID, spec.From = "sbx-xferfork", cp.ID
	fork, err := rig.b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fork.Destroy(context.Background()) })
	if _, _, writes, reads := agentCalls(rig.sim, n0); len(writes)+len(reads) > 0 {
		t.Errorf("the checkpoint and the fork went through the agent: file-writes %v, file-reads %v; log:\n%s", writes, reads, rig.logs)
	}
	if got, want := fmt.Sprint(rig.served()), "[GET 200 PUT 204 GET 200]"; got != want {
		t.Errorf("the callback server served %s, want %s (the source's workspace in, its checkpoint out, the fork's in)", got, want)
	}
	if got := guestSums(t, fork); fmt.Sprint(got) != fmt.Sprint(sums) {
		t.Errorf("in the fork %v, in the source %v", got, sums)
	}
}

// TestTransferURL: a loopback callback URL carries no transfers (a
// VM's loopback is its own), and a URL that is not http(s) is refused.
func TestTransferURL(t *testing.T) {
	t.Parallel()
	if b, err := proxmox.New(nil, proxmox.Config{TransferURL: "http://127.0.0.1:8765"}); err != nil || b.Transfers() != nil {
		t.Errorf("a loopback callback URL: %v %v", b, err)
	}
	if _, err := proxmox.New(nil, proxmox.Config{TransferURL: "ftp://10.0.0.7/"}); err == nil || !strings.Contains(err.Error(), "http:// or https://") {
		t.Errorf("an ftp URL: %v", err)
	}
}

// reaches says whether a sandbox's guest reaches the callback server
// (any HTTP answer to curl).
func reaches(t *testing.T, sb sandbox.Instance) bool {
	t.Helper()
	_, out := runCmd(t, sb, sandbox.Command{Args: []string{"/bin/sh", "-c",
		"curl -s -o /dev/null -w '%{http_code}' --connect-timeout 3 --max-time 5 http://" + guestCallback + "/transfer/0; true"}, OutputLimit: 1 << 10})
	return strings.TrimSpace(out) != "000"
}

// simVMOf is the simulator's VM of a sandbox (its name ends in its job).
func simVMOf(t *testing.T, sim *pvesim.Server, job string) pvesim.VM {
	t.Helper()
	for _, v := range sim.VMs() {
		if strings.HasSuffix(v.Config["name"], "-"+job) {
			return v
		}
	}
	t.Fatalf("no VM of %s", job)
	return pvesim.VM{}
}

// TestForkWarmOverHTTP (issue 38): with a pool whose VMs have a NIC
// (PoolConfig.Network), a fork of a sandbox without network takes warm
// VMs and gets its files over HTTP (no agent/file-write), the archive as
// the server packed it; then its NIC is unplugged: the fork has no NIC
// and reaches nothing, as its source. A job without network that takes
// such a VM has its NIC unplugged in its claim. Where the guest does not
// let the NIC go, the fork fails and its VM is destroyed, and a job gets
// a cold VM instead.
func TestForkWarmOverHTTP(t *testing.T) {
	t.Parallel()
	rig := newXferRig(t, true, "http://"+guestCallback, func(c *proxmox.Config) { c.CheckpointDir = t.TempDir() })
	ctx := context.Background()
	spec := sandbox.Spec{JobID: "sbx-warmsrc", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, MultiExec: true}
	src, err := rig.b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Destroy(context.Background()) })
	dir, sums := randomTree(t, 3, 256<<10)
	putTree(t, src, dir)
	cfg := poolCfg(2)
	cfg.Network = true
	stop, err := rig.b.KeepPool(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	waitReady(t, rig.b, 2)
	pooled := map[int]bool{}
	for _, v := range poolVMs(rig.sim) {
		pooled[v.VMID] = true
		if v.Config["net0"] == "" {
			t.Errorf("pool VM %d has no NIC: %v", v.VMID, v.Config)
		}
	}
	cp, err := src.(sandbox.Checkpointer).Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n0, served0 := len(rig.sim.Requests()), len(rig.served())
	forks := make([]sandbox.Instance, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Go(func() {
			fs := spec
			fs.JobID, fs.From = fmt.Sprintf("sbx-warmfork%d", i), cp.ID
			forks[i], errs[i] = rig.b.Create(ctx, fs)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		t.Cleanup(func() { forks[i].Destroy(context.Background()) })
	}
	if _, _, writes, _ := agentCalls(rig.sim, n0); len(writes) > 0 {
		t.Errorf("the forks' files went through the agent: %v; log:\n%s", writes, rig.logs)
	}
	if got := fmt.Sprint(rig.served()[served0:]); got != "[GET 200 GET 200]" {
		t.Errorf("the callback server served %s to the forks, want a GET each", got)
	}
	for i, fk := range forks {
		v := simVMOf(t, rig.sim, fmt.Sprintf("sbx-warmfork%d", i))
		if !pooled[v.VMID] {
			t.Errorf("fork %d is VM %d, not a warm one of %v", i, v.VMID, pooled)
		}
		if v.Config["net0"] != "" || v.Pending != nil {
			t.Errorf("fork %d keeps a NIC: %v, pending %v", i, v.Config["net0"], v.Pending)
		}
		if got := guestSums(t, fk); fmt.Sprint(got) != fmt.Sprint(sums) {
			t.Errorf("fork %d has %v, the source %v", i, got, sums)
		}
		if reaches(t, fk) {
			t.Errorf("fork %d, of a sandbox without network, reaches the callback server", i)
		}
	}

	// A job without network: the warm VM's NIC goes in its claim.
	waitReady(t, rig.b, 2)
	job, err := rig.b.Create(ctx, sandbox.Spec{JobID: "job-warmplain", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Destroy(context.Background()) })
	if v := simVMOf(t, rig.sim, "job-warmplain"); v.Config["net0"] != "" || !strings.Contains(v.Config["tags"], "delegate") {
		t.Errorf("a job without network in a warm VM: %v", v.Config)
	}
	if reaches(t, job) {
		t.Error("a job without network reaches the callback server")
	}
	// The probe does reach it from a VM with a NIC.
	if withNet := rig.vm(t, true); !reaches(t, withNet) {
		t.Error("a VM with a NIC does not reach the callback server: the probe proves nothing")
	}

	// A guest that keeps its NIC: the fork fails, its VM destroyed; a job
	// goes cold.
	waitReady(t, rig.b, 2)
	rig.sim.SetFaults(pvesim.Faults{StuckUnplugs: true})
	spec.JobID, spec.From = "sbx-stuckfork", cp.ID
	if fk, err := rig.b.Create(ctx, spec); err == nil || !strings.Contains(err.Error(), "still busy in guest") {
		t.Errorf("a fork whose NIC stays: %v %v", fk, err)
	}
	testkit.Eventually(t, 30*time.Second, "the stuck fork's VM destroyed", func() bool {
		return !slices.ContainsFunc(rig.sim.VMs(), func(v pvesim.VM) bool { return strings.HasSuffix(v.Config["name"], "-sbx-stuckfork") })
	})
	cold, err := rig.b.Create(ctx, sandbox.Spec{JobID: "job-stuckplain", CPU: 1, MemoryBytes: 256 << 20, DiskBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cold.Destroy(context.Background()) })
	if v := simVMOf(t, rig.sim, "job-stuckplain"); v.Config["net0"] != "" || pooled[v.VMID] {
		t.Errorf("a job when warm VMs keep their NICs: VM %d %v", v.VMID, v.Config)
	}
}
