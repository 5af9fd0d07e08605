// Command opal-client is the policy agent. Each subcommand is one function
// in its own file; this file only dispatches.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/benbjohnson/clock"
)

// cmdEnv is what a subcommand may touch, so tests can run it in-process.
type cmdEnv struct {
	args      []string
	lookup    func(string) (string, bool) // the environment
	environ   func() []string             // the environment as NAME=value lines; nil: none (warnings only)
	stdout    io.Writer
	stderr    io.Writer
	clock     clock.Clock
	rand      func() float64    // nil: the fetcher's default source
	transport http.RoundTripper // nil: http.DefaultTransport
}

// commands maps each subcommand to its function; exit codes are its own.
var commands = map[string]func(context.Context, cmdEnv) int{
	"fetch":        runFetch,
	"run":          runRun,
	"print-config": runPrintConfig,
	"version":      runVersion,
}

// shutdownSignals all run the same orderly shutdown (final backup included).
// SIGHUP is among them because its default action kills the process at once
// (exit 129) without that shutdown; an init system or a closing terminal
// sends it, and the agent has no configuration file to reload.
var shutdownSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// usage is the text of --help; the wording of the commands matches
// docs/operations.md.
const usage = `usage: opal-client <command> [flags]

A policy agent for OPAL: subscribes to an OPAL server, loads policy bundles
and data into OPA (embedded, or external over REST), and serves the client
API. Configuration is the OPAL_ environment only (docs/configuration.md).

commands:
  run            the daemon; exits 0 after SIGTERM, SIGINT or SIGHUP (all three
                 run the same orderly shutdown, final backup included)
  fetch          one policy fetch with the full retry policy; prints a JSON
                 summary (fetch -h for its flags); exit 0 ok, 2 non-retryable,
                 3 exhausted, 1 bad config
  print-config   the effective configuration as JSON, secrets masked
  version        the build version
  help           this text (also -h, --help)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	code := dispatch(ctx, cmdEnv{args: os.Args[1:], lookup: os.LookupEnv, environ: os.Environ, stdout: os.Stdout, stderr: os.Stderr, clock: clock.New()})
	stop()
	os.Exit(code)
}

// dispatch runs the subcommand named by e.args[0]. Asking for help prints the
// usage on stdout and exits 0; no or an unknown command prints it on stderr
// and exits 1.
func dispatch(ctx context.Context, e cmdEnv) int {
	if len(e.args) > 0 {
		switch e.args[0] {
		case "help", "-h", "-help", "--help":
			fmt.Fprint(e.stdout, usage)
			return exitOK
		}
		if cmd, ok := commands[e.args[0]]; ok {
			e.args = e.args[1:]
			return cmd(ctx, e)
		}
		fmt.Fprintf(e.stderr, "opal-client: unknown command %q\n\n", e.args[0])
	}
	fmt.Fprint(e.stderr, usage)
	return exitUsage
}
