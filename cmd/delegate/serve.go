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
	"strconv"
	"time"

	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/mcpserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serve runs the MCP server (stdio or Streamable HTTP) and the callback
// server over one engine until ctx ends.
func serve(ctx context.Context, cfg cli.Config, opts cli.ServeOptions, log *slog.Logger) error {
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
	if opts.HTTPAddr == "" {
		log.Info("serving MCP on stdio", "data_dir", cfg.DataDir)
		err := server.Run(ctx, &mcp.StdioTransport{})
		if ctx.Err() != nil || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	ln, err := net.Listen("tcp", opts.HTTPAddr)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.HTTPHandler(server, opts.SessionTimeout, log))
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
