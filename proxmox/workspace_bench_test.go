package proxmox_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/proxmox"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/workspace"
)

// sourceTree writes about size bytes of source-like text (Go functions
// with varying names and numbers: it compresses as code does) in files
// of about 8 KB, 50 per directory.
func sourceTree(b *testing.B, size int) string {
	b.Helper()
	dir := b.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	written := 0
	for i := 0; written < size; i++ {
		var sb strings.Builder
		fmt.Fprintf(&sb, "package p%d\n\nimport \"fmt\"\n\n", i/50)
		for sb.Len() < 8000 {
			n := r.IntN(100000)
			fmt.Fprintf(&sb, "// handle%d checks the value %d.\nfunc handle%d(v int) error {\n\tif v > %d {\n\t\treturn fmt.Errorf(\"value %%d over %d\", v)\n\t}\n\treturn nil\n}\n\n", n, n, n, n*3, n*3)
		}
		p := filepath.Join(dir, fmt.Sprintf("pkg%03d", i/50), fmt.Sprintf("file%04d.go", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
		written += sb.Len()
	}
	return dir
}

// BenchmarkWorkspaceSim copies a 10 MB source tree into a VM of the
// simulator at a real cluster's request and guest-agent latencies
// (pvesim.RealLatency: every request 10-50 ms, an agent call 25 ms more),
// as the engine does (Scan, Archive with gzip, PutArchive: file-write
// parts, one exec), then reads its changes back after 10 files were
// modified (GetArchive and ReadChanges), and reports the seconds and the
// Proxmox API calls of each. The VM is made and destroyed outside the
// timings.
//
//	go test -run '^$' -bench WorkspaceSim -benchtime 3x ./proxmox/
func BenchmarkWorkspaceSim(b *testing.B) {
	real := pvesim.RealLatency()
	sim, err := pvesim.New(pvesim.Options{Nodes: pvesim.DefaultNodes(1), TaskDelay: 20 * time.Millisecond, BootDelay: 100 * time.Millisecond,
		RequestLatency: real.RequestLatency, AgentLatency: real.AgentLatency, AgentPingTimeout: real.AgentPingTimeout,
		AuthFailureDelay: -1, SandboxDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	if err := sim.AddTemplate("pve1", 9000, "debian-job", pvesim.TemplateSpec{}); err != nil {
		b.Fatal(err)
	}
	if err := sim.AddToken(pvesim.Token{ID: "bench@pve!tk", Secret: "s3cret", Privileges: pvesim.RoleAdministrator}); err != nil {
		b.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: "bench@pve", TokenName: "tk", TokenValue: "s3cret",
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), TaskPollInterval: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	be, err := proxmox.New(c, proxmox.Config{Template: "debian-job", PollInterval: 200 * time.Millisecond, Instance: "bench1"})
	if err != nil {
		b.Fatal(err)
	}
	src := sourceTree(b, 10<<20)
	tree, err := workspace.Scan(ctx, src, workspace.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var imp, back time.Duration
	var impCalls, backCalls, sent int
	for b.Loop() {
		b.StopTimer()
		inst, err := be.Create(ctx, sandbox.Spec{JobID: "job-bench", CPU: 1, MemoryBytes: 512 << 20, DiskBytes: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		n0 := len(sim.Requests())
		b.StartTimer()

		t0 := time.Now()
		pr, pw := io.Pipe()
		counted := &countingReader{r: pr}
		var base *workspace.Baseline
		go func() {
			var err error
			base, err = tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: true})
			pw.CloseWithError(err)
		}()
		if _, err := inst.(sandbox.Archiver).PutArchive(ctx, counted); err != nil {
			b.Fatal(err)
		}
		imp += time.Since(t0)
		impCalls += len(sim.Requests()) - n0
		sent += counted.n

		b.StopTimer()
		proc, err := inst.Exec(ctx, sandbox.Command{Args: []string{"/bin/sh", "-c", `for f in $(ls pkg000/*.go | head -10); do echo '// changed' >> "$f"; done`},
			Env: []string{"PATH=/usr/bin:/bin"}, OutputLimit: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		if exit, err := proc.Wait(ctx); err != nil || exit.Code != 0 {
			b.Fatalf("modify: %+v %v", exit, err)
		}
		n1 := len(sim.Requests())
		b.StartTimer()

		t1 := time.Now()
		rc, err := inst.(sandbox.Archiver).GetArchive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		cs, err := workspace.ReadChanges(ctx, base, rc, workspace.ChangesOptions{})
		rc.Close()
		if err != nil || cs.Modified != 10 {
			b.Fatalf("changes: %+v %v", cs, err)
		}
		back += time.Since(t1)
		backCalls += len(sim.Requests()) - n1

		b.StopTimer()
		if err := inst.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(tree.Bytes)/1e6, "source-MB")
	b.ReportMetric(float64(sent)/n/1e6, "sent-MB")
	b.ReportMetric(imp.Seconds()/n, "import-s")
	b.ReportMetric(float64(impCalls)/n, "import-calls")
	b.ReportMetric(back.Seconds()/n, "changes-s")
	b.ReportMetric(float64(backCalls)/n, "changes-calls")
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// realSim is a simulated cluster at a real cluster's request and
// guest-agent latencies (pvesim.RealLatency), whose guests with a NIC
// reach a callback server at 10.0.0.7:8765, and two backends on it with
// the client's defaults, as serve's (20 requests a second, 40 at once):
// viaAgent, whose files go through the guest agent, and viaHTTP, which
// that callback server serves transfers for.
func realSim(b *testing.B) (sim *pvesim.Server, viaAgent, viaHTTP *proxmox.Backend) {
	b.Helper()
	real := pvesim.RealLatency()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sim, err = pvesim.New(pvesim.Options{Nodes: pvesim.DefaultNodes(1), TaskDelay: 20 * time.Millisecond, BootDelay: 100 * time.Millisecond,
		RequestLatency: real.RequestLatency, AgentLatency: real.AgentLatency, AgentPingTimeout: real.AgentPingTimeout,
		AuthFailureDelay: -1, SandboxDir: b.TempDir(), CallbackPort: 8765, Hosts: map[string]string{"10.0.0.7:8765": ln.Addr().String()}})
	if err != nil {
		b.Fatal(err)
	}
	if err := sim.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sim.Close() })
	if err := sim.AddTemplate("pve1", 9000, "debian-job", pvesim.TemplateSpec{}); err != nil {
		b.Fatal(err)
	}
	if err := sim.AddToken(pvesim.Token{ID: "bench@pve!tk", Secret: "s3cret", Privileges: pvesim.RoleAdministrator}); err != nil {
		b.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(sim.URL(), "https://"), ":")
	p, _ := strconv.Atoi(port)
	c, err := pve.New(pve.Config{Host: host, Port: p, User: "bench@pve", TokenName: "tk", TokenValue: "s3cret",
		SSLMode: pve.SSLVerify, Fingerprint: sim.Fingerprint(), TaskPollInterval: 50 * time.Millisecond, RateLimit: 20, RateBurst: 40})
	if err != nil {
		b.Fatal(err)
	}
	if viaAgent, err = proxmox.New(c, proxmox.Config{Template: "debian-job", Instance: "bench1"}); err != nil {
		b.Fatal(err)
	}
	if viaHTTP, err = proxmox.New(c, proxmox.Config{Template: "debian-job", Instance: "bench2", TransferURL: "http://10.0.0.7:8765"}); err != nil {
		b.Fatal(err)
	}
	srv := httpapi.CallbackServer(httpapi.Services{Transfers: viaHTTP.Transfers()}, httpapi.Options{})
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return sim, viaAgent, viaHTTP
}

// BenchmarkWorkspace100MB copies a 100 MB workspace (random files: 100
// MB compressed too) into a VM with a network at a real cluster's
// request and guest-agent latencies (pvesim.RealLatency), through the
// guest agent (no transfer URL: file-write parts of 45 KiB) and over
// HTTP (the guest's curl fetches it from the callback server,
// transfer.go), and reports the seconds and the Proxmox API calls of
// each. The VMs are made and destroyed outside the timings.
//
//	go test -run '^$' -bench Workspace100MB -benchtime 1x ./proxmox/
//
// With -short it measures the HTTP path only.
func BenchmarkWorkspace100MB(b *testing.B) {
	sim, viaAgent, viaHTTP := realSim(b)
	ctx := context.Background()
	dir := b.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 2<<20)
	for i := range 50 {
		for j := range buf {
			buf[j] = byte(r.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("blob%02d.bin", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	tree, err := workspace.Scan(ctx, dir, workspace.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	put := func(be *proxmox.Backend) (time.Duration, int, int) {
		b.StopTimer()
		defer b.StartTimer()
		inst, err := be.Create(ctx, sandbox.Spec{JobID: "job-bench", CPU: 1, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, Network: true})
		if err != nil {
			b.Fatal(err)
		}
		defer inst.Destroy(ctx)
		n0 := len(sim.Requests())
		t0 := time.Now()
		pr, pw := io.Pipe()
		counted := &countingReader{r: pr}
		go func() {
			_, err := tree.Archive(ctx, pw, workspace.ArchiveOptions{Gzip: true})
			pw.CloseWithError(err)
		}()
		if _, err := inst.(sandbox.Archiver).PutArchive(ctx, counted); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), len(sim.Requests()) - n0, counted.n
	}
	for b.Loop() {
		// -short leaves out the agent path: it takes minutes (about 2,300
		// calls), and the HTTP figure is the one the goal is about.
		if !testing.Short() {
			at, ac, _ := put(viaAgent)
			b.ReportMetric(at.Seconds(), "agent-s")
			b.ReportMetric(float64(ac), "agent-calls")
		}
		ht, hc, sent := put(viaHTTP)
		b.ReportMetric(float64(sent)/1e6, "sent-MB")
		b.ReportMetric(ht.Seconds(), "http-s")
		b.ReportMetric(float64(hc), "http-calls")
	}
}
