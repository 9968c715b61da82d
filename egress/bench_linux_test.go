//go:build linux

package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testnet"
)

// The figures of issue 23: time to first byte and throughput of a 100 MB
// download through the proxy, as ratios to the same download made directly
// in the same run (goal: ≤ 1.2× the time, ≥ 0.8× the throughput), and the
// proxy's memory per 100 concurrent connections. Run with
//
//	go test ./egress/ -run XXX -bench . -benchtime 5x
//
// Each iteration downloads directly and through the proxy, in alternating
// order; the ratios are of the medians.

const downloadBytes = 100 << 20

func BenchmarkDownload100MB(b *testing.B) {
	f := newFixture(b, nil)
	const tok = "bench"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(b, "allowed.test")})
	sb := newSandbox(b, f.p, tok)
	directT, proxyT, transparentT := benchTransports(b, f, sb, tok)
	for _, c := range []struct {
		name    string
		url     string
		through *http.Transport
	}{
		{"http-proxy", "http://allowed.test/big", proxyT},
		{"https-connect", "https://allowed.test/big", proxyT},
		{"https-transparent", "https://allowed.test/big", transparentT},
		{"http-transparent", "http://allowed.test/big", transparentT},
	} {
		b.Run(c.name, func(b *testing.B) {
			u := c.url + "?n=" + strconv.Itoa(downloadBytes)
			var dTTFB, pTTFB, dTotal, pTotal []time.Duration
			b.SetBytes(downloadBytes)
			for i := 0; b.Loop(); i++ {
				order := []*http.Transport{directT, c.through}
				if i%2 == 1 {
					slices.Reverse(order)
				}
				for _, tr := range order {
					ttfb, total := download(b, tr, u)
					if tr == directT {
						dTTFB, dTotal = append(dTTFB, ttfb), append(dTotal, total)
					} else {
						pTTFB, pTotal = append(pTTFB, ttfb), append(pTotal, total)
					}
				}
			}
			mb := float64(downloadBytes) / (1 << 20)
			b.ReportMetric(float64(median(pTTFB))/float64(median(dTTFB)), "ttfb-ratio")
			b.ReportMetric(float64(median(dTotal))/float64(median(pTotal)), "throughput-ratio")
			b.ReportMetric(float64(median(dTTFB).Microseconds()), "direct-ttfb-µs")
			b.ReportMetric(float64(median(pTTFB).Microseconds()), "proxy-ttfb-µs")
			b.ReportMetric(mb/median(dTotal).Seconds(), "direct-MiB/s")
			b.ReportMetric(mb/median(pTotal).Seconds(), "proxy-MiB/s")
		})
	}
}

// benchTransports are the clients of the benchmarks: direct from the
// test's namespace, through the shared listener with the proxy variables,
// and from the sandbox ignoring them. Every client dials from a thread of
// its own namespace, the sandbox's one from a thread in the sandbox, so
// that what a dial costs is the same for all and the rest is the proxy's;
// the sandbox's client asks the sandbox's resolver (the proxy's DNS), as a
// job does.
func benchTransports(b *testing.B, f *fixture, sb *sandbox, tok string) (direct, proxied, transparent *http.Transport) {
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("job", tok), Host: f.proxy}
	tlsConf := &tls.Config{RootCAs: f.w.Roots}
	inHost, inSandbox := newNSDialer(b, "/proc/self/ns/net"), newNSDialer(b, "/run/netns/"+sb.ns)
	dialVia := func(d *nsDialer, r *net.Resolver) func(context.Context, string, string) (net.Conn, error) {
		return func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			ips, err := r.LookupNetIP(ctx, "ip4", host)
			if err != nil {
				return nil, err
			}
			return d.dial("tcp", net.JoinHostPort(ips[0].String(), port))
		}
	}
	sandboxResolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return inSandbox.dial(network, "10.0.2.3:53")
	}}
	direct = &http.Transport{DialContext: dialVia(inHost, f.w.Resolver), TLSClientConfig: tlsConf, DisableKeepAlives: true, DisableCompression: true}
	proxied = &http.Transport{Proxy: http.ProxyURL(proxyURL), DialContext: dialVia(inHost, f.w.Resolver), TLSClientConfig: tlsConf, DisableKeepAlives: true, DisableCompression: true}
	transparent = &http.Transport{DialContext: dialVia(inSandbox, sandboxResolver), TLSClientConfig: tlsConf, DisableKeepAlives: true, DisableCompression: true}
	return direct, proxied, transparent
}

// download fetches u and returns the time to the first response byte and
// to the last.
func download(b *testing.B, tr *http.Transport, u string) (time.Duration, time.Duration) {
	var first time.Time
	start := time.Now()
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotFirstResponseByte: func() { first = time.Now() },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != downloadBytes {
		b.Fatalf("%s: %d bytes, %v", u, n, err)
	}
	return first.Sub(start), time.Since(start)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkMemoryPer100Conns runs the proxy in a process of its own (this
// binary as a helper) and measures what 100 open connections through it
// cost: resident memory, Go heap and stacks, goroutines.
func BenchmarkMemoryPer100Conns(b *testing.B) {
	testnet.World(b)
	exe, _ := os.Executable()
	for _, kind := range []string{"connect", "http"} {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(exe)
				cmd.Env = append(os.Environ(), helperEnv+"=proxy")
				stdin, _ := cmd.StdinPipe()
				stdout, _ := cmd.StdoutPipe()
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				out := bufio.NewScanner(stdout)
				out.Scan()
				addr := strings.TrimPrefix(out.Text(), "addr ")
				stats := func() map[string]float64 {
					fmt.Fprintln(stdin, "stats")
					out.Scan()
					m := map[string]float64{}
					for f := range strings.FieldsSeq(out.Text()) {
						k, v, _ := strings.Cut(f, "=")
						m[k], _ = strconv.ParseFloat(v, 64)
					}
					return m
				}
				// Warm up with one connection, so that what is counted is
				// per connection, not the first one's set-up.
				c := openThrough(b, addr, kind)
				c.Close()
				// The proxy's end of it closes when it reads the close:
				// no event says when, out of its process.
				time.Sleep(100 * time.Millisecond)
				before := stats()
				var conns []net.Conn
				for range 100 {
					conns = append(conns, openThrough(b, addr, kind))
				}
				after := stats()
				for _, c := range conns {
					c.Close()
				}
				stdin.Close()
				cmd.Wait()
				b.ReportMetric((after["rss"]-before["rss"])/1024, "rss-KiB/100conns")
				b.ReportMetric((after["heap"]+after["stack"]-before["heap"]-before["stack"])/1024, "go-KiB/100conns")
				b.ReportMetric(after["goroutines"]-before["goroutines"], "goroutines/100conns")
			}
		})
	}
}

// openThrough opens a connection through the proxy at addr that has
// carried one request and is kept open: a CONNECT tunnel, or a plain HTTP
// keep-alive connection.
func openThrough(b *testing.B, addr, kind string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	br := bufio.NewReader(c)
	auth := "Proxy-Authorization: Basic am9iOmJlbmNo\r\n" // job:bench
	if kind == "connect" {
		fmt.Fprintf(c, "CONNECT 203.0.113.10:80 HTTP/1.1\r\nHost: 203.0.113.10:80\r\n%s\r\n", auth)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("CONNECT: %v %v", resp, err)
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	} else {
		fmt.Fprintf(c, "GET http://203.0.113.10/ HTTP/1.1\r\nHost: 203.0.113.10\r\n%s\r\n", auth)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET through %s: %v %v", kind, resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	return c
}

// runHelper is this test binary as a tool; "proxy" serves an egress-only
// proxy for the job "bench" on a loopback port it prints, and answers
// "stats" lines on stdin with its memory.
func runHelper(name string) int {
	if name != "proxy" {
		fmt.Fprintln(os.Stderr, "unknown helper", name)
		return 2
	}
	j := &jobs{}
	j.set("bench", Policy{Mode: Egress})
	p, err := New(Config{Policies: j})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go p.Serve(context.Background(), ln, "")
	fmt.Println("addr", ln.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Printf("heap=%d stack=%d goroutines=%d rss=%d\n", ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine(), rss())
	}
	return 0
}

// rss is this process's resident memory in bytes.
func rss() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkTTFB is the time to the first byte of a small response, on a
// new connection each time, through the proxy and directly: the 100 MB
// download's first byte, measured often enough for a stable median.
func BenchmarkTTFB(b *testing.B) {
	f := newFixture(b, nil)
	const tok = "bench"
	f.jobs.set(tok, Policy{Mode: Allowlist, Allow: mustRules(b, "allowed.test")})
	sb := newSandbox(b, f.p, tok)
	direct, proxied, transparent := benchTransports(b, f, sb, tok)
	for _, c := range []struct {
		name, url string
		through   *http.Transport
	}{
		{"http-proxy", "http://allowed.test/", proxied},
		{"https-connect", "https://allowed.test/", proxied},
		{"https-transparent", "https://allowed.test/", transparent},
		{"http-transparent", "http://allowed.test/", transparent},
	} {
		b.Run(c.name, func(b *testing.B) {
			var d, p []time.Duration
			for i := 0; b.Loop(); i++ {
				order := []*http.Transport{direct, c.through}
				if i%2 == 1 {
					slices.Reverse(order)
				}
				for _, tr := range order {
					var first time.Time
					start := time.Now()
					ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
					resp, err := (&http.Client{Transport: tr}).Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if tr == direct {
						d = append(d, first.Sub(start))
					} else {
						p = append(p, first.Sub(start))
					}
				}
			}
			b.ReportMetric(float64(median(p))/float64(median(d)), "ttfb-ratio")
			b.ReportMetric(float64(median(d).Microseconds()), "direct-µs")
			b.ReportMetric(float64(median(p).Microseconds()), "proxy-µs")
		})
	}
}
