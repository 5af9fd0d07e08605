// Command devrun is `make run`: it starts the dev OPAL server on the example
// policy (examples/policy) and data sources (examples/data), and the agent
// with its embedded OPA and data updater, waits until the agent is ready,
// prints the curl commands that ask a decision, publish a data update that
// changes it, and read the metrics, and stays in the foreground until Ctrl-C
// stops both.
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
	data := flag.String("data-dir", "examples/data", "data sources directory the dev server serves (base data)")
	serverAddr := flag.String("server-addr", "127.0.0.1:7002", "dev server address")
	apiPort := flag.String("api-port", "7000", "client API port")
	opaAddr := flag.String("opa-addr", "127.0.0.1:8181", "embedded OPA address")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	server := exec.Command(*bin+"/opal-devserver", "-addr", *serverAddr, "-policy-dir", *policy, "-data-dir", *data)
	agent := exec.Command(*bin+"/opal-client", "run")
	agent.Env = append(os.Environ(),
		"OPAL_SERVER_URL=http://"+*serverAddr,
		"OPAL_CLIENT_API_SERVER_PORT="+*apiPort,
		`OPAL_INLINE_OPA_CONFIG={"addr":"`+*opaAddr+`"}`,
		"OPAL_DATA_UPDATER_ENABLED=true",
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
== opal-client is ready: the dev server serves %[1]s (policy) and %[2]s (base data),
the agent loaded both into its embedded OPA.

Ask a decision: may dave (a viewer, from %[2]s/accounts.json) write documents? false.

  curl -s -X POST http://%[3]s/v1/data/app/rbac/allow -d '{"input":{"user":"dave","action":"write","resource":"documents"}}'

Publish a data update through the dev server: it makes dave an editor.

  curl -s -X POST http://%[5]s/admin/data-update -d '{"reason":"promote dave","entries":[{"url":"","topics":["policy_data"],"dst_path":"/accounts","save_method":"PATCH","data":[{"op":"add","path":"/dave/roles/-","value":"editor"}]}]}'

Now run the decision curl again: the answer is true.
(alice is an admin in the policy bundle; carol is a viewer.)

Health, readiness and metrics:

  curl -s http://127.0.0.1:%[4]s/healthcheck
  curl -s http://127.0.0.1:%[4]s/ready
  curl -s http://127.0.0.1:%[4]s/metrics | grep ^opal_client

Edit a file under %[1]s: the dev server notices within 2 s and the agent applies the change.
A reconnect (or curl -X POST http://127.0.0.1:%[4]s/data-updater/trigger) reloads the base data from %[2]s.
Ctrl-C stops both.

`, *policy, *data, *opaAddr, *apiPort, *serverAddr)
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
