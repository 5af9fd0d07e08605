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
	"sort"
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, cmdEnv{args: os.Args[1:], lookup: os.LookupEnv, environ: os.Environ, stdout: os.Stdout, stderr: os.Stderr, clock: clock.New()})
	stop()
	os.Exit(code)
}

// dispatch runs the subcommand named by e.args[0]; 1 on a usage error.
func dispatch(ctx context.Context, e cmdEnv) int {
	if len(e.args) > 0 {
		if cmd, ok := commands[e.args[0]]; ok {
			e.args = e.args[1:]
			return cmd(ctx, e)
		}
	}
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(e.stderr, "usage: opal-client <command> [flags]; commands: %v\n", names)
	return 1
}
