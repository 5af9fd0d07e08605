package main

import (
	"context"
	"fmt"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/agent"
)

// runRun is `opal-client run`: the daemon. It exits 0 after SIGTERM/SIGINT
// (ctx) once everything has shut down, 1 on bad configuration or a failed
// start.
func runRun(ctx context.Context, e cmdEnv) int {
	if len(e.args) > 0 {
		fmt.Fprintf(e.stderr, "run: unexpected argument %q (configure with OPAL_ variables)\n", e.args[0])
		return exitUsage
	}
	cfg, err := config.LoadFrom(e.lookup)
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return exitUsage
	}
	log := cfg.Logger(e.stderr)
	for _, w := range configWarnings(e, cfg) {
		log.Warn(w.Message, "variable", w.Var)
	}
	a, err := agent.New(ctx, agent.Options{
		Config:         cfg,
		Clock:          e.clock,
		Rand:           e.rand,
		Logger:         log,
		Transport:      e.transport,
		Version:        buildVersion(),
		NewDataUpdater: agent.NewDataUpdater,
	})
	if err != nil {
		if ctx.Err() != nil { // SIGTERM/SIGINT while starting: a clean stop
			log.Info("stopped while starting", "error", err)
			return exitOK
		}
		log.Error("cannot start", "error", err)
		return exitUsage
	}
	if err := a.Run(ctx); err != nil {
		log.Error("stopped on error", "error", err)
		return exitUsage
	}
	return exitOK
}

// configWarnings are the variables of the environment that do nothing: names
// no setting has, Python client settings not read, settings without effect.
func configWarnings(e cmdEnv, cfg *config.Config) []config.Warning {
	var environ []string
	if e.environ != nil {
		environ = e.environ()
	}
	return append(config.UnknownVariables(environ), cfg.Warnings()...)
}
