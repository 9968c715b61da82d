//go:build linux

package local

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/internal/testnet"
	"github.com/delegate-dev/delegate/sandbox"
	"golang.org/x/sys/unix"
)

// The wired path's figures (issue 23): a job in a local sandbox fetches
// through the egress proxy (the proxy variables, and redirected without
// them) and, in the same run, the same way with plain egress (pasta, the
// network helper the proxy replaces): the time to the first byte of a
// small response, and the throughput of a 100 MB download, as ratios of
// medians (goal: ≤ 1.2× the time, ≥ 0.8× the throughput). The client is
// curl inside the sandbox, timing itself (-w), as a job's tools would;
// rounds alternate the two paths.
//
//	go test ./local/ -run '^$' -bench EgressWired -benchtime 3x

const wiredBig = 100 << 20

func BenchmarkEgressWired(b *testing.B) {
	if !testnet.IsolatedBench(b) {
		return
	}
	if _, err := exec.LookPath("pasta"); err != nil {
		b.Skip("the comparison needs pasta (apt-get install passt)")
	}
	w := testnet.World(b)
	pols := &policies{p: map[string]egress.Policy{}}
	rec := egress.NewRecorder(10)
	// Its 100 tunnels open at once, past a job's default rate (what is
	// measured is their memory, not the rate's cap).
	p, err := egress.New(egress.Config{Policies: pols, Sink: rec, Resolver: w.Resolver, RootCAs: w.Roots, ConnRate: 1000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	bk := newBackend(b, 0)
	bk.proxies.server = p
	b.Cleanup(func() { bk.Close() })
	rules, _ := egress.ParseRules([]string{"allowed.test"})
	pols.set("bench", egress.Policy{Mode: egress.Allowlist, Allow: rules})
	spec := egressSpec("bench")
	spec.MultiExec = true
	spec.MemoryBytes = 1 << 30
	proxied := create(b, bk, spec)
	writeRoots(b, proxied, w)
	env := proxyEnv(bk, "bench")

	// curl's own timings of n fetches of url: first byte, total, bytes.
	fetch := func(sb sandbox.Instance, env []string, n int, url string, extra string) (ttfb, total []time.Duration) {
		script := fmt.Sprintf(`for i in $(seq %d); do curl -sS -o /dev/null --cacert /workspace/roots.pem %s -w '%%{time_starttransfer} %%{time_total} %%{size_download}\n' '%s' || exit 1; done`, n, extra, url)
		pr, err := sb.Exec(context.Background(), sandbox.Command{Args: []string{"/bin/sh", "-c", script}, Env: env, OutputLimit: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		exit, out := finish(b, pr)
		if exit.Code != 0 {
			b.Fatalf("curl: %s", out)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				continue
			}
			s1, _ := strconv.ParseFloat(f[0], 64)
			s2, _ := strconv.ParseFloat(f[1], 64)
			ttfb = append(ttfb, time.Duration(s1*float64(time.Second)))
			total = append(total, time.Duration(s2*float64(time.Second)))
		}
		return ttfb, total
	}
	// A pasta sandbox runs one command: one per round.
	plain := func() sandbox.Instance {
		s := defaultSpec()
		s.Network, s.MemoryBytes = true, 1<<30
		sb, err := bk.Create(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		writeRoots(b, sb, w)
		return sb
	}
	for _, c := range []struct {
		name, url, extra string
		n                int
	}{
		{"ttfb-http", "http://allowed.test/", "", 40},
		{"ttfb-https", "https://allowed.test/", "", 40},
		{"100MB-http", "http://allowed.test/big?n=" + strconv.Itoa(wiredBig), "", 3},
		{"100MB-https", "https://allowed.test/big?n=" + strconv.Itoa(wiredBig), "", 3},
	} {
		for _, via := range []string{"proxy-vars", "redirected"} {
			b.Run(c.name+"/"+via, func(b *testing.B) {
				penv := env
				if via == "redirected" {
					penv = testEnv // no proxy variables: the sandbox's DNS and the transparent listeners
				}
				var pT, dT, pTot, dTot []time.Duration
				for i := 0; b.Loop(); i++ {
					runProxy := func() {
						t1, t2 := fetch(proxied, penv, c.n, c.url, c.extra)
						pT, pTot = append(pT, t1...), append(pTot, t2...)
					}
					runPlain := func() {
						sb := plain()
						t1, t2 := fetch(sb, testEnv, c.n, c.url, c.extra)
						dT, dTot = append(dT, t1...), append(dTot, t2...)
						sb.Destroy(context.Background())
					}
					if i%2 == 0 {
						runProxy()
						runPlain()
					} else {
						runPlain()
						runProxy()
					}
				}
				b.ReportMetric(float64(median(pT))/float64(median(dT)), "ttfb-ratio")
				b.ReportMetric(float64(median(pT).Microseconds()), "proxy-ttfb-µs")
				b.ReportMetric(float64(median(dT).Microseconds()), "pasta-ttfb-µs")
				if strings.HasPrefix(c.name, "100MB") {
					mb := float64(wiredBig) / (1 << 20)
					b.ReportMetric(float64(median(dTot))/float64(median(pTot)), "throughput-ratio")
					b.ReportMetric(mb/median(pTot).Seconds(), "proxy-MiB/s")
					b.ReportMetric(mb/median(dTot).Seconds(), "pasta-MiB/s")
				}
			})
		}
	}

	// The proxy's memory per 100 open connections from the sandbox: TLS
	// tunnels through the proxy variables (CONNECT), opened by a process
	// in the sandbox (the test binary as a helper) to a sink in the sites'
	// namespace (another), so that only the proxy's side of them is in
	// this process. The client sends its ClientHello, which the proxy
	// reads for the allowlist and passes on; the sink never answers.
	b.Run("memory-100-tunnels", func(b *testing.B) {
		withHelper(b, proxied)
		self, _ := os.Executable()
		sink := exec.Command("ip", "netns", "exec", testnet.SitesNS, self)
		sink.Env = append(os.Environ(), testHelperEnv+"=sink")
		sink.Args = append(sink.Args, testnet.Allowed+":8443")
		out, _ := sink.StdoutPipe()
		if err := sink.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sink.Process.Kill(); sink.Wait() })
		sinkOut := bufio.NewReader(out)
		if l, _ := sinkOut.ReadString('\n'); l != "listening\n" {
			b.Fatalf("sink: %q", l)
		}
		for b.Loop() {
			removeStop(b, proxied) // the last round's helper has ended (finish)
			before, gBefore := goMemory()
			pr, err := proxied.Exec(context.Background(), sandbox.Command{Args: []string{"/workspace/helper", "100", "allowed.test:8443", "/workspace/roots.pem"},
				Env: append([]string{testHelperEnv + "=tunnels"}, env...), OutputLimit: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			if !waitFor(60*time.Second, func() bool {
				outs, _ := pr.ReadOutput(context.Background(), 0, 1<<20)
				return strings.Contains(string(sandbox.Join(outs)), "open 100")
			}) {
				outs, _ := pr.ReadOutput(context.Background(), 0, 1<<20)
				b.Fatalf("the tunnels did not open: %s", sandbox.Join(outs))
			}
			// The ClientHellos pass through the proxy after the tunnels
			// opened: the sink says when each has arrived, and the
			// proxy's memory is measured after.
			read := make(chan error, 1)
			go func() {
				for range 100 {
					if l, err := sinkOut.ReadString('\n'); err != nil || l != "read\n" {
						read <- fmt.Errorf("sink: %q %v", l, err)
						return
					}
				}
				read <- nil
			}()
			select {
			case err := <-read:
				if err != nil {
					b.Fatal(err)
				}
			case <-time.After(60 * time.Second):
				b.Fatal("the sink did not read from 100 tunnels")
			}
			after, gAfter := goMemory()
			b.ReportMetric(float64(after-before)/(1<<10), "KiB-Go/100")
			b.ReportMetric(float64(gAfter-gBefore), "goroutines/100")
			proxied.WriteFile(context.Background(), "/workspace/stop", nil, 0o644)
			finish(b, pr)
		}
	})
}

// removeStop removes the helper's stop file.
func removeStop(b *testing.B, sb *sbox) {
	if err := os.Remove(filepath.Join(sb.dir, dirWorkspace, "stop")); err != nil && !os.IsNotExist(err) {
		b.Fatal(err)
	}
}

// runTunnels is the "tunnels" helper: N TLS connections to host:port
// through the proxy variables' proxy, held until /workspace/stop exists.
func runTunnels(args []string) int {
	n, _ := strconv.Atoi(args[0])
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(args[2])
	if err != nil || !roots.AppendCertsFromPEM(pem) {
		fmt.Println("roots:", err)
		return 1
	}
	proxy := strings.TrimPrefix(os.Getenv("https_proxy"), "http://")
	host, _, _ := net.SplitHostPort(args[1])
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
		if err != nil {
			fmt.Println("dial:", err)
			return 1
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", args[1], args[1])
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				fmt.Println("CONNECT:", err)
				return 1
			}
			if l == "\r\n" {
				break
			}
		}
		// The ClientHello goes; the handshake waits for ever (the sink
		// never answers), holding the tunnel open.
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
		go tc.Handshake()
		conns = append(conns, tc)
	}
	fmt.Printf("open %d\n", len(conns))
	// Held until the benchmark writes /workspace/stop: inotify says when
	// a file is made there.
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		fmt.Println("inotify:", err)
		return 1
	}
	if _, err := unix.InotifyAddWatch(fd, "/workspace", unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		fmt.Println("inotify:", err)
		return 1
	}
	buf := make([]byte, 4096)
	for {
		if _, err := os.Stat("/workspace/stop"); err == nil {
			return 0
		}
		if _, err := unix.Read(fd, buf); err != nil && err != unix.EINTR {
			fmt.Println("inotify:", err)
			return 1
		}
	}
}

func writeRoots(b testing.TB, sb sandbox.Instance, w *testnet.W) {
	if err := sb.WriteFile(context.Background(), "/workspace/roots.pem", w.RootsBytes, 0o644); err != nil {
		b.Fatal(err)
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// goMemory is the Go heap and stacks in use, and the goroutines, after a
// collection.
func goMemory() (uint64, int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse, runtime.NumGoroutine()
}
