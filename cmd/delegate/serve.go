package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func cmdServe(ctx context.Context, cfg config, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "", "serve MCP Streamable HTTP at ADDR (e.g. 127.0.0.1:8080) instead of stdio")
	sessionTimeout := fs.Duration("session-timeout", 30*time.Minute, "close idle HTTP sessions after this long")
	cfg.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.check(); err != nil {
		return usageError{err}
	}
	// stdout is the MCP channel in stdio mode: logs go to stderr only.
	log := newLogger(stderr, cfg.LogLevel)
	callbacks, callbackURL := listenCallbacks(cfg, log)
	a, err := openApp(ctx, cfg, log, true, callbackURL)
	if err != nil {
		if callbacks != nil {
			callbacks.Close()
		}
		return err
	}
	defer a.Close()
	if callbacks != nil {
		srv := &http.Server{Handler: httpapi.Handler(a.eng, httpapi.Options{Logger: log}), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(callbacks)
		defer srv.Close()
	}
	if err := a.eng.Start(ctx); err != nil {
		return err
	}
	server := mcpserver.New(ctx, a.eng, log)
	if *httpAddr == "" {
		log.Info("serving MCP on stdio", "data_dir", cfg.DataDir)
		err := server.Run(ctx, &mcp.StdioTransport{})
		if ctx.Err() != nil || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.HTTPHandler(server, *sessionTimeout, log))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	log.Info("serving MCP over Streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "data_dir", cfg.DataDir)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listenCallbacks binds the callback server. If the port is taken (most
// often by another delegate on this machine, which serves the same data
// dir's jobs just as well), jobs still run: they report through their
// status file, and through that other server when CALLBACK_PUBLIC_URL
// points at it.
func listenCallbacks(cfg config, log *slog.Logger) (net.Listener, string) {
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
