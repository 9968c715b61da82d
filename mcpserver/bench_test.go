package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/mock"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkToolCall measures one tools/call, client to server and back,
// in process: against the mock service (the MCP layer alone) and against a
// real engine over SQLite in a temporary directory (what `delegate serve`
// does per call, minus the process boundary). Each run prints the p50 and
// p99 latency of a call besides ns/op:
//
//	go test -run '^$' -bench ToolCall -benchtime 2000x ./mcpserver/
func BenchmarkToolCall(b *testing.B) {
	services := []struct {
		name string
		make func(b *testing.B) delegate.JobService
	}{
		{"mock", func(*testing.B) delegate.JobService { return benchMock() }},
		{"engine", benchEngine},
	}
	for _, svc := range services {
		b.Run(svc.name, func(b *testing.B) {
			s := svc.make(b)
			cs := benchConnect(b, s)
			ctx := context.Background()
			submit := &mcp.CallToolParams{Name: "submit_job", Arguments: map[string]any{
				"manifest": map[string]any{"task": "bench task", "agentType": "script", "agent": map[string]any{"command": "sleep 86400"}, "timeout": 86400}}}
			// Jobs to read, as the harness does: submitted first.
			var ids []string
			for range 200 {
				res, err := cs.CallTool(ctx, submit)
				if err != nil || res.IsError {
					b.Fatalf("submit: %v %v", err, res)
				}
				ids = append(ids, res.StructuredContent.(map[string]any)["job_id"].(string))
			}
			b.Run("get_job_status", func(b *testing.B) {
				i := 0
				benchCalls(b, func() error {
					i++
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_job_status", Arguments: map[string]any{"job_id": ids[(i*7919)%len(ids)]}})
					if err == nil && res.IsError {
						b.Fatalf("get_job_status: %v", res.Content)
					}
					return err
				})
			})
			b.Run("submit_job", func(b *testing.B) {
				benchCalls(b, func() error {
					res, err := cs.CallTool(ctx, submit)
					if err == nil && res.IsError {
						b.Fatalf("submit_job: %v", res.Content)
					}
					return err
				})
			})
		})
	}
}

// benchCalls runs call b.N times and reports the p50 and p99 of one call.
func benchCalls(b *testing.B, call func() error) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1e6 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

// benchConnect connects the SDK's client to the server as `delegate serve`
// runs it: delegate's stdio transport, over OS pipes.
func benchConnect(b *testing.B, svc delegate.JobService) *mcp.ClientSession {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	server := newServer(ctx, svc, slog.New(slog.DiscardHandler))
	toServerR, toServerW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	toClientR, toClientW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	ss, err := server.Connect(ctx, mcpserver.StdioTransport(toServerR, toClientW, mcpserver.Limits{}, nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.IOTransport{Reader: toClientR, Writer: toServerW}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close(); ss.Close() })
	return cs
}

// benchMock answers like a store that holds the job, without one.
func benchMock() *mock.JobService {
	s := &mock.JobService{}
	s.WatchFn = func(ctx context.Context) <-chan string {
		ch := make(chan string)
		go func() { <-ctx.Done(); close(ch) }()
		return ch
	}
	now := time.Now().UTC()
	s.SubmitFn = func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
		if err := m.Validate(); err != nil {
			return nil, err
		}
		return &delegate.Job{ID: "job-0123456789abcdef", Status: delegate.StatusPending, Manifest: m, CreatedAt: now, UpdatedAt: now}, nil
	}
	s.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return &delegate.Job{ID: id, Status: delegate.StatusPending, Progress: "queued", CreatedAt: now, UpdatedAt: now,
			Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "bench task"}}, nil
	}
	s.TimelineFn = func(ctx context.Context, id string) ([]delegate.Event, error) { return nil, nil }
	return s
}

// benchEngine is a real engine over SQLite whose jobs stay queued, as in
// the harness: the one run slot is taken by a sandbox that never finishes
// being created.
func benchEngine(b *testing.B) delegate.JobService {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	backend := sandboxtest.NewFake()
	backend.CreateHook = func(ctx context.Context, _ sandbox.Spec) error { <-ctx.Done(); return ctx.Err() }
	eng := engine.New(store, backend, engine.Config{MaxConcurrent: 1, ArtifactDir: b.TempDir()})
	if err := eng.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close(); store.Close() })
	return eng
}

// BenchmarkRawCall measures the server alone: a client that writes
// prebuilt request lines on a pipe and reads response lines, with no
// client SDK of its own (the TypeScript client the harness uses costs
// little more than that).
//
//	go test -run '^$' -bench RawCall -benchtime 5000x ./mcpserver/
func BenchmarkRawCall(b *testing.B) {
	for _, svc := range []struct {
		name string
		make func(b *testing.B) delegate.JobService
	}{
		{"mock", func(*testing.B) delegate.JobService { return benchMock() }},
		{"engine", benchEngine},
	} {
		b.Run(svc.name, func(b *testing.B) {
			s := svc.make(b)
			ctx, cancel := context.WithCancel(context.Background())
			b.Cleanup(cancel)
			server := newServer(ctx, s, slog.New(slog.DiscardHandler))
			toServerR, toServerW, _ := os.Pipe()
			toClientR, toClientW, _ := os.Pipe()
			ss, err := server.Connect(ctx, mcpserver.StdioTransport(toServerR, toClientW, mcpserver.Limits{}, nil), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { toServerW.Close(); ss.Close() })
			in := bufio.NewReader(toClientR)
			id := 0
			roundTrip := func(method, params string) []byte {
				id++
				line := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"` + method + `","params":` + params + "}\n"
				if _, err := io.WriteString(toServerW, line); err != nil {
					b.Fatal(err)
				}
				resp, err := in.ReadBytes('\n')
				if err != nil {
					b.Fatal(err)
				}
				return resp
			}
			roundTrip("initialize", `{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}`)
			io.WriteString(toServerW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
			submit := `{"name":"submit_job","arguments":{"manifest":{"task":"bench task","agentType":"script","agent":{"command":"sleep 86400"},"timeout":86400}}}`
			var ids []string
			for range 200 {
				var r struct {
					Result struct {
						StructuredContent struct {
							JobID string `json:"job_id"`
						} `json:"structuredContent"`
					} `json:"result"`
				}
				json.Unmarshal(roundTrip("tools/call", submit), &r)
				ids = append(ids, r.Result.StructuredContent.JobID)
			}
			b.Run("get_job_status", func(b *testing.B) {
				i := 0
				benchCalls(b, func() error {
					i++
					roundTrip("tools/call", `{"name":"get_job_status","arguments":{"job_id":"`+ids[(i*7919)%len(ids)]+`"}}`)
					return nil
				})
			})
			b.Run("submit_job", func(b *testing.B) {
				benchCalls(b, func() error {
					roundTrip("tools/call", submit)
					return nil
				})
			})
		})
	}
}
