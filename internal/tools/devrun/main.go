// Command devrun is `make run`: it starts the dev OPAL server on the example
// policy (examples/policy) and the agent with its embedded OPA, waits until
// the agent is ready, prints the curl commands that ask a decision and read
// the metrics, and stays in the foreground until Ctrl-C stops both.
//
// It expects the binaries in ./bin (make build). Ports: server 7002, client
// API 7000, OPA 8181 (override with -server-addr, -api-port, -opa-addr).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding opal-client and opal-devserver")
	policy := flag.String("policy-dir", "examples/policy", "policy directory the dev server serves")
	serverAddr := flag.String("server-addr", "127.0.0.1:7002", "dev server address")
	apiPort := flag.String("api-port", "7000", "client API port")
	opaAddr := flag.String("opa-addr", "127.0.0.1:8181", "embedded OPA address")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	server := exec.Command(*bin+"/opal-devserver", "-addr", *serverAddr, "-policy-dir", *policy)
	agent := exec.Command(*bin+"/opal-client", "run")
	agent.Env = append(os.Environ(),
		"OPAL_SERVER_URL=http://"+*serverAddr,
		"OPAL_CLIENT_API_SERVER_PORT="+*apiPort,
		`OPAL_INLINE_OPA_CONFIG={"addr":"`+*opaAddr+`"}`,
		"OPAL_DATA_UPDATER_ENABLED=false",
	)
	for _, c := range []*exec.Cmd{server, agent} {
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "devrun: %v (run `make build` first)\n", err)
			stopAll(server, agent)
			os.Exit(1)
		}
	}
	exited := make(chan string, 2)
	go func() { _ = server.Wait(); exited <- "opal-devserver" }()
	go func() { _ = agent.Wait(); exited <- "opal-client" }()

	ready := "http://127.0.0.1:" + *apiPort + "/ready"
	if waitReady(ctx, ready, exited) {
		fmt.Printf(`
== opal-client is ready: the dev server serves %s, the agent loaded it into its embedded OPA.
Ask a decision (alice is an admin; try carol/write too):

  curl -s -X POST http://%s/v1/data/app/rbac/allow -d '{"input":{"user":"alice","action":"read","resource":"documents"}}'

Health, readiness and metrics:

  curl -s http://127.0.0.1:%s/healthcheck
  curl -s http://127.0.0.1:%s/ready
  curl -s http://127.0.0.1:%s/metrics | grep ^opal_client

Edit a file under %s: the dev server notices within 2 s and the agent applies the change.
Ctrl-C stops both.

`, *policy, *opaAddr, *apiPort, *apiPort, *apiPort, *policy)
	}
	select {
	case <-ctx.Done():
	case name := <-exited:
		fmt.Fprintf(os.Stderr, "devrun: %s exited\n", name)
	}
	stopAll(server, agent)
	// Both get SIGTERM; the agent exits 0 after a clean shutdown.
	for range 2 {
		select {
		case <-exited:
		case <-clock.New().After(15 * time.Second):
			_ = server.Process.Kill()
			_ = agent.Process.Kill()
		}
	}
}

func stopAll(cmds ...*exec.Cmd) {
	for _, c := range cmds {
		if c.Process != nil {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
	}
}

// waitReady polls /ready for up to a minute; false if it never answered 200.
func waitReady(ctx context.Context, url string, exited chan string) bool {
	clk := clock.New()
	t := clk.Ticker(200 * time.Millisecond)
	defer t.Stop()
	give := clk.After(time.Minute)
	for {
		select {
		case <-ctx.Done():
			return false
		case name := <-exited:
			exited <- name
			return false
		case <-give:
			fmt.Fprintln(os.Stderr, "devrun: the agent is not ready after a minute; see its log above")
			return false
		case <-t.C:
			resp, err := http.Get(url)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return true
				}
			}
		}
	}
}
