package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/opal-go/opal-client/config"
)

// runPrintConfig is `opal-client print-config`: the effective configuration
// (defaults and derived values included) as one JSON object keyed by
// variable name, secrets masked. Exit 1 on bad configuration.
func runPrintConfig(_ context.Context, e cmdEnv) int {
	if len(e.args) > 0 {
		fmt.Fprintf(e.stderr, "print-config: unexpected argument %q\n", e.args[0])
		return exitUsage
	}
	cfg, err := config.LoadFrom(e.lookup)
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return exitUsage
	}
	for _, w := range configWarnings(e, cfg) {
		fmt.Fprintln(e.stderr, "warning:", w.Message)
	}
	out, err := json.MarshalIndent(cfg.Masked(), "", "  ") // map keys come out sorted
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return exitUsage
	}
	fmt.Fprintln(e.stdout, string(out))
	return exitOK
}
