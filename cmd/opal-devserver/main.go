// Command opal-devserver runs the protocol-compatible dev OPAL server: it
// serves -policy-dir as policy bundles, watches it by polling, and publishes
// change notifications to connected clients; -data-dir serves data sources
// and POST /admin/data-update publishes data updates. See docs/devserver.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/opal-go/opal-client/internal/devserver"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "opal-devserver:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:7002", "listen address")
	dir := flag.String("policy-dir", ".", "directory served as the policy repository")
	token := flag.String("token", "", "required Bearer token (empty: no auth)")
	dataDir := flag.String("data-dir", "", "directory of *.json data sources, served at /data-sources/ and listed by /data/config")
	dataConfig := flag.String("data-config", "", "file whose JSON is served as /data/config (overrides -data-dir's listing)")
	poll := flag.Duration("poll", 2*time.Second, "how often the policy directory is rescanned (0: never)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	clk := clock.New()
	opts := devserver.Options{PolicyDir: *dir, Token: *token, DataDir: *dataDir, Clock: clk, Logger: log}
	if *dataConfig != "" {
		b, err := os.ReadFile(*dataConfig)
		if err != nil {
			return err
		}
		if !json.Valid(b) {
			return fmt.Errorf("-data-config %s: not JSON", *dataConfig)
		}
		opts.DataConfig = b
	}
	srv := devserver.New(opts)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "policy_dir", *dir, "hash", srv.Hash(), "auth", *token != "",
		"data_dir", *dataDir)

	var tick <-chan time.Time
	if *poll > 0 {
		t := clk.Ticker(*poll)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			if _, err := srv.Rescan(); err != nil {
				log.Warn("rescan failed", "err", err)
			}
		case err := <-errc:
			return err
		case <-ctx.Done():
			srv.Close()
			sctx, cancel := clk.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		}
	}
}
