package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
)

// Exit codes of `opal-client fetch`.
const (
	exitOK           = 0
	exitUsage        = 1 // bad configuration or usage (also: interrupted)
	exitNonRetryable = 2 // 409, 404, body too large
	exitExhausted    = 3 // retries exhausted on retryable errors
)

// fetchSummary is the one JSON object `fetch` prints on stdout.
type fetchSummary struct {
	Outcome        string  `json:"outcome"` // success, non_retryable, exhausted, cancelled
	Hash           string  `json:"hash,omitempty"`
	OldHash        *string `json:"old_hash"`
	PolicyModules  int     `json:"policy_modules"`
	DataModules    int     `json:"data_modules"`
	DeletedFiles   int     `json:"deleted_files"`
	Attempts       int     `json:"attempts"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	LastStatus     int     `json:"last_status"`
	Error          string  `json:"error,omitempty"`
}

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// runFetch is `opal-client fetch [--path DIR]... [--base-hash SHA]`: one
// policy fetch with the configured retry policy, summarised as JSON.
func runFetch(ctx context.Context, e cmdEnv) int {
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var paths repeated
	fs.Var(&paths, "path", "directory to fetch (repeatable; default: OPAL_POLICY_SUBSCRIPTION_DIRS)")
	baseHash := fs.String("base-hash", "", "fetch a delta from this commit (default: a full bundle)")
	if err := fs.Parse(e.args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "fetch: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	cfg, err := config.LoadFrom(e.lookup)
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return exitUsage
	}
	if len(paths) == 0 {
		paths = cfg.PolicySubscriptionDirs
	}
	log := cfg.Logger(e.stderr)
	fo := fetcher.PolicyOptions(cfg)
	tc, err := cfg.ServerTLSConfig()
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return exitUsage
	}
	transport := e.transport
	if transport == nil && tc != nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tc
		transport = t
	}
	fo.HTTPClient = &http.Client{Transport: transport}
	fo.Clock, fo.Rand, fo.Logger = e.clock, e.rand, log
	fo.OnRetry = func(r fetcher.Retry) {
		log.Info("retrying policy fetch", "attempt", r.Attempt, "status", r.Outcome.Status,
			"class", r.Outcome.Class, "wait", r.Wait, "error", errString(r.Outcome.Err))
	}
	f := fetcher.New(fo)
	res, err := f.Fetch(ctx, fetcher.Request{Paths: paths, BaseHash: *baseHash})

	sum := fetchSummary{Attempts: res.Attempts, ElapsedSeconds: res.Elapsed.Seconds(), LastStatus: res.LastStatus, Error: errString(err)}
	code := exitOK
	var nre *fetcher.NonRetryableError
	var re *fetcher.RetryableError
	switch {
	case err == nil:
		b := res.Bundle
		sum.Outcome, sum.Hash, sum.OldHash = "success", b.Hash, b.OldHash
		sum.PolicyModules, sum.DataModules = len(b.PolicyModules), len(b.DataModules)
		if b.DeletedFiles != nil {
			sum.DeletedFiles = len(b.DeletedFiles.DataModules) + len(b.DeletedFiles.PolicyModules)
		}
	case errors.As(err, &nre):
		sum.Outcome, code = "non_retryable", exitNonRetryable
	case errors.As(err, &re):
		sum.Outcome, code = "exhausted", exitExhausted
	default: // cancelled by a signal
		sum.Outcome, code = "cancelled", exitUsage
	}
	out, _ := json.Marshal(sum)
	fmt.Fprintln(e.stdout, string(out))
	return code
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
