package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/dashboard"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/delegate-dev/delegate/internal/buildinfo"
	"github.com/delegate-dev/delegate/internal/handoff"
	"github.com/delegate-dev/delegate/internal/handoff/front"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/delegate-dev/delegate/metrics"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/errgroup"
)

// serve runs the MCP server (stdio or Streamable HTTP, with the dashboard
// and the metrics beside it) and the callback server over one engine
// until ctx ends. Every goroutine of the server's life runs in one
// errgroup: the first to fail ends the others, and all have ended before
// the engine and the store close.
func serve(ctx context.Context, cfg cli.Config, opts cli.ServeOptions, log *slog.Logger) (err error) {
	if opts.HTTPAddr == "" {
		stdioProcs()
	}
	var met *metrics.Metrics // only served over HTTP
	if opts.HTTPAddr != "" {
		met = metrics.New(metrics.Options{Logger: log})
	}
	// A server without the job tools runs no jobs: it opens no backend
	// (whose settings, such as a local DEFAULT_VM_TEMPLATE, it need not
	// meet) nor callback server, and only reads the job store.
	runsJobs := cfg.HasToolset("jobs")
	var callbacks net.Listener
	var callbackURL string
	if runsJobs {
		callbacks, callbackURL = listenCallbacks(cfg, log)
	}
	// The --http listener first: its address goes in this server's lease,
	// where the other servers of a shared store find it.
	var ln net.Listener
	var advertise string
	if opts.HTTPAddr != "" {
		if ln, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
			if callbacks != nil {
				callbacks.Close()
			}
			return fmt.Errorf("--http: %w", err)
		}
		defer ln.Close() // (served, it is closed by its server first)
		advertise = advertised(cfg.AdvertiseURL, ln.Addr(), opts.TLSCert != "")
	}
	a, err := openApp(ctx, cfg, log, appOptions{RunJobs: runsJobs, CallbackURL: callbackURL, Metrics: met,
		Serve: true, Addr: advertise})
	if err != nil {
		if callbacks != nil {
			callbacks.Close()
		}
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	ctx, stop := context.WithCancel(ctx)
	g, ctx := errgroup.WithContext(ctx)
	defer func() {
		stop()
		err = errors.Join(err, g.Wait())
	}()
	if callbacks != nil {
		cbOpts := httpapi.Options{Logger: log}
		if met != nil {
			cbOpts.Answered = met.CallbackAnswered
		}
		svcs := httpapi.Services{Callbacks: a.eng, Questions: a.eng}
		if a.pool != nil {
			if t := a.pool.Transfers(); t != nil {
				svcs.Transfers = t // job VMs' workspaces, over HTTP
			}
		}
		srv := httpapi.CallbackServer(svcs, cbOpts)
		// Closed at once at the end: a job's long poll for an answer
		// would hold a graceful shutdown for its whole wait.
		serveUntil(ctx, g, srv, 0, func() error { return srv.Serve(callbacks) })
	}
	// The pool first: jobs the engine starts at once may take its VMs.
	if stopPool, err := keepPool(ctx, cfg, a, met, log); err != nil {
		return err
	} else if stopPool != nil {
		defer stopPool()
	}
	if runsJobs {
		if err := a.eng.Start(ctx); err != nil {
			return err
		}
	}
	if runsJobs {
		if err := serveHandOff(ctx, g, cfg, a, log); err != nil {
			return err
		}
	}
	server, err := newMCPServer(ctx, g, cfg, a.eng, log)
	if err != nil {
		return err
	}
	if opts.HTTPAddr == "" {
		log.Info("serving MCP on stdio", "data_dir", cfg.DataDir, "store", storeName(cfg), "gomaxprocs", runtime.GOMAXPROCS(0))
		err := server.Run(ctx, mcpserver.StdioTransport(os.Stdin, os.Stdout, mcpserver.Limits{}, log))
		if ctx.Err() != nil || errors.Is(err, io.EOF) {
			return nil // a part that failed says why through g.Wait
		}
		return err
	}
	return serveHTTP(ctx, g, cfg, opts, ln, server, a, met, log)
}

// advertised is where the other servers of a shared store reach this
// one's --http listener: DELEGATE_ADVERTISE_URL, else the listener's
// address (the host's name where it listens on every interface).
func advertised(explicit string, addr net.Addr, tls bool) string {
	if explicit != "" {
		return explicit
	}
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return scheme + addr.String()
	}
	host := tcp.IP.String()
	if tcp.IP.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			host = name
		}
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

// serveUntil serves srv in g (serveFn is its Serve or ServeTLS) until ctx
// ends, then shuts it down: gracefully for up to grace (requests in
// flight end), or at once with a grace of 0.
func serveUntil(ctx context.Context, g *errgroup.Group, srv *http.Server, grace time.Duration, serveFn func() error) {
	g.Go(func() error {
		if err := serveFn(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		if grace > 0 {
			shutdown, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			if srv.Shutdown(shutdown) == nil {
				return nil
			}
		}
		return srv.Close()
	})
}

// stdioProcs runs a stdio server's Go code on one processor, unless the
// GOMAXPROCS variable says otherwise. Such a server has one client, on the
// same host, that waits for each answer. With a second processor idle, each
// goroutine the MCP SDK hands a request to (three per call) wakes another
// thread, which spins, finds nothing and sleeps again: on a 2-core VM that
// nearly doubled a get_job_status call's CPU and added ~50 µs to its
// latency (docs/BENCHMARKS.md). Sandboxes are processes of their own and
// blocking system calls leave the processor, so neither is held back by
// this; an HTTP server, with many clients, keeps every core.
func stdioProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// serveHTTP serves /mcp, the dashboard, /metrics and /health until ctx ends.
func serveHTTP(ctx context.Context, g *errgroup.Group, cfg cli.Config, opts cli.ServeOptions, ln net.Listener, server *mcp.Server, a *app, met *metrics.Metrics, log *slog.Logger) error {
	sessions := httpapi.LimitSessions(mcpserver.HTTPHandler(server, opts.SessionTimeout, log), opts.MaxSessions, opts.SessionTimeout)
	met.CountSessions(sessions.Len)
	// Every request is a principal's: the shared token's (the local
	// operator), a token of delegate's own (the store's), or, open on the
	// loopback interface without a token, the local operator's. An
	// issuer's access tokens come in as Guard.Extra.
	guard := &httpauth.Guard{Shared: opts.Token, Tokens: a.store, Open: opts.Token == nil && opts.OAuth == nil, Logger: log}
	g.Go(func() error { return guard.Recheck(ctx, httpauth.RecheckInterval, opts.SessionTimeout) })
	mux := http.NewServeMux()
	if opts.OAuth != nil {
		// An issuer's access tokens are tried last, and a refusal names
		// the metadata, which says where to get one.
		guard.Extra = append(guard.Extra, opts.OAuth)
		guard.Challenge = opts.OAuth.ChallengeFunc(httpauth.Realm)
		for _, p := range opts.OAuth.MetadataPaths() {
			mux.Handle(p, opts.OAuth.MetadataHandler())
		}
	}
	mux.Handle("/mcp", guard.Require(sessions))
	mux.Handle("GET /metrics", guard.RequireScope(delegate.ScopeAdmin, "/metrics", met.Handler()))
	// Commands other servers of a shared store forward here (for the
	// local kept sandboxes this one holds): signed with the store's
	// secret, not a user's token.
	mux.Handle("POST "+delegate.ForwardPath, httpapi.ForwardHandler(a.eng, log))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.Handle("/", dashboard.Handler(dashboard.Services{Jobs: a.eng, Sandboxes: a.eng, Questions: a.eng, Network: a.eng, Workspaces: a.eng, Checkpoints: a.eng,
		Principals: engine.NewPrincipals(a.store, log)}, dashboard.Options{Token: opts.Token, Guard: guard, Logger: log}))
	srv := &http.Server{
		Handler:           httpapi.LoopbackOnly(httpapi.BodyTimeout(mux, httpapi.BodyIdleTimeout, httpapi.BodyTotalTimeout)),
		ReadHeaderTimeout: httpapi.HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		// Requests live within the server's life: at shutdown the event
		// streams (MCP's and the dashboard's) end instead of holding it.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	tls := opts.TLSCert != ""
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	base := scheme + ln.Addr().String()
	auth := "none (loopback only)"
	if opts.Token != nil {
		auth = "DELEGATE_HTTP_TOKEN"
	}
	if (opts.Token != nil || opts.OAuth != nil) && !tls && !isLoopback(ln.Addr()) {
		log.Warn("tokens travel in clear text over plain HTTP: serve with --tls-cert and --tls-key, or behind a TLS proxy")
	}
	if opts.OAuth != nil {
		issued := "access tokens of " + strings.Join(opts.OAuth.Issuers(), ", ") + " for " + opts.OAuth.Resource()
		if opts.Token == nil {
			auth = issued
		} else {
			auth += ", " + issued
		}
	}
	log.Info("serving MCP over Streamable HTTP", "url", base+"/mcp", "dashboard", base+"/", "metrics", base+"/metrics",
		"auth", auth, "max_sessions", opts.MaxSessions, "data_dir", cfg.DataDir, "store", storeName(cfg))
	serveUntil(ctx, g, srv, 5*time.Second, func() error {
		var err error
		if tls {
			err = srv.ServeTLS(ln, opts.TLSCert, opts.TLSKey)
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("--http: %w", err)
		}
		return err
	})
	<-ctx.Done() // the signal, or a part of g failing (serve's g.Wait says which)
	sessions.Wait()
	return nil
}

func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// listenCallbacks binds the callback server. If the port is taken (most
// often by another delegate on this machine, which serves the same data
// dir's jobs just as well), jobs still run: they report through their
// status file, and through that other server when CALLBACK_PUBLIC_URL
// points at it.
func listenCallbacks(cfg cli.Config, log *slog.Logger) (net.Listener, string) {
	if cfg.CallbackPort == 0 {
		return nil, ""
	}
	addr := net.JoinHostPort(cfg.CallbackHost, strconv.Itoa(cfg.CallbackPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Warn("no callback server: jobs report through their status file", "addr", addr, "err", err)
		if os.Getenv("CALLBACK_PUBLIC_URL") != "" {
			return nil, cfg.CallbackPublicURL
		}
		return nil, ""
	}
	log.Info("callback server listening", "addr", ln.Addr().String(), "public_url", cfg.CallbackPublicURL)
	return ln, cfg.CallbackPublicURL
}

// serveHandOff takes the data dir's hand-off socket, when no other
// server has it, and runs there the `delegate run` and `delegate exec`
// commands handed to it (internal/handoff, docs/cli.md) over this
// server's engine, as the CLI would run them in a process of its own.
func serveHandOff(ctx context.Context, g *errgroup.Group, cfg cli.Config, a *app, log *slog.Logger) error {
	hs, err := handoff.Listen(cfg.DataDir, log)
	if err != nil {
		// The CLI then runs its commands itself, as without a server.
		log.Warn("the CLI's hand-off socket is not served", "err", err)
		return nil
	}
	if hs == nil {
		log.Debug("another server serves the CLI's hand-off socket", "data_dir", cfg.DataDir)
		return nil
	}
	svc := cli.Services{Jobs: a.eng, Sandboxes: a.eng, Questions: a.eng, Network: a.eng, Workspaces: a.eng,
		Retention: a.eng, Checkpoints: a.eng, Principals: engine.NewPrincipals(a.store, log)}
	g.Go(func() error {
		return hs.Serve(ctx, func(ctx context.Context, r *handoff.Request) (int, bool) {
			if !front.HandedOff(r.Args) {
				return 0, true
			}
			h := &cli.HandOff{Server: cfg}
			code := cli.Execute(ctx, cli.Program{
				Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr,
				Getenv: r.Getenv, Version: buildinfo.Version(), Dir: r.Dir, HandOff: h,
				Open: func(context.Context, cli.Config, *slog.Logger, bool) (cli.Services, func() error, error) {
					return svc, func() error { return nil }, nil
				},
			}, r.Args)
			if code == cli.ExitDeclined {
				log.Debug("a handed command is run by its own process", "why", h.Declined, "pid", r.PID)
				return 0, true
			}
			log.Debug("ran a command handed by its process", "pid", r.PID, "exit", code)
			return code, false
		})
	})
	return nil
}
