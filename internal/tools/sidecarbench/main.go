// Command sidecarbench measures `opal-client run` as a sidecar beside its peer,
// OPA's own server (`opa run --server`, built from the OPA module pinned in
// go.mod), on this machine and in one run:
//
//   - startup-to-ready (process start to our /ready 200, to OPA's
//     /health?bundles 200) and resident memory (VmRSS, VmHWM) with the example
//     bundle (examples/policy) and with a generated 1,000-module / 10 MB bundle;
//     ours fetches the bundle from the dev server (internal/devserver, in this
//     process), OPA loads the same directory with --bundle;
//   - notification-to-decision latency: the dev server publishes a one-module
//     change and we time until the agent's embedded OPA answers the new
//     decision, p50 and p99 over -updates updates, repeated -latency-runs times.
//
// It prints a Markdown table (stdout) for docs/performance.md; progress goes
// to stderr. Run it from the repository root:
//
//	go run ./internal/tools/sidecarbench
//
// It builds both binaries into a temporary directory first (-client-bin and
// -opa-bin skip that). Every process it starts is stopped by PID (SIGTERM,
// then SIGKILL after 10 s); everything listens on 127.0.0.1 only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/tools/child"
)

// Targets of the sidecar comparison (docs/performance.md).
const (
	memTargetPct   = 115                    // our VmRSS <= 1.15 x OPA's VmRSS, in integer percent
	startupTarget  = 300 * time.Millisecond // our ready time - OPA's ready time
	latencyTarget  = 25 * time.Millisecond  // p99 notification-to-decision, small delta
	readyPoll      = 2 * time.Millisecond
	decisionPoll   = time.Millisecond
	readyBound     = 2 * time.Minute
	decisionBound  = 10 * time.Second
	memSamples     = 5
	memSampleEvery = 200 * time.Millisecond
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sidecarbench:", err)
		os.Exit(1)
	}
}

type options struct {
	goCmd, clientBin, opaBin, example string
	reps, updates, latencyRuns        int
	largeUpdates                      int
	inline                            inlineOptions // inlineopa.go
}

func run() error {
	var o options
	flag.StringVar(&o.goCmd, "go", "go", "go command used to build the binaries")
	flag.StringVar(&o.clientBin, "client-bin", "", "prebuilt opal-client (default: go build ./cmd/opal-client)")
	flag.StringVar(&o.opaBin, "opa-bin", "", "prebuilt opa (default: go install the OPA version pinned in go.mod)")
	flag.StringVar(&o.example, "example", "examples/policy", "example policy directory")
	flag.IntVar(&o.reps, "reps", 5, "start-ups of each binary per bundle (medians are reported)")
	flag.IntVar(&o.updates, "updates", 200, "one-module updates per latency run")
	flag.IntVar(&o.latencyRuns, "latency-runs", 3, "latency runs (each a fresh agent)")
	flag.IntVar(&o.largeUpdates, "large-updates", 20, "one-module updates on the 1,000-module bundle (0: skip)")
	o.inline.flags()
	flag.Parse()
	if o.reps < 1 || o.updates < 1 || o.latencyRuns < 1 || o.largeUpdates < 0 {
		return errors.New("-reps, -updates and -latency-runs must be >= 1, -large-updates >= 0")
	}

	tmp, err := os.MkdirTemp("", "sidecarbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b := &bench{clk: clock.New(), tmp: tmp, hc: &http.Client{Timeout: 5 * time.Second}}
	wall := b.clk.Now()

	opaVersion, err := output(o.goCmd, "list", "-m", "-f", "{{.Version}}", "github.com/open-policy-agent/opa")
	if err != nil {
		return fmt.Errorf("reading the pinned OPA version: %w", err)
	}
	if o.clientBin == "" {
		o.clientBin = filepath.Join(tmp, "opal-client")
		progress("building opal-client")
		if _, err := output(o.goCmd, "build", "-o", o.clientBin, "./cmd/opal-client"); err != nil {
			return err
		}
	}
	if o.opaBin == "" {
		progress("building opa %s", opaVersion)
		if _, err := outputEnv([]string{"GOBIN=" + tmp}, o.goCmd, "install", "github.com/open-policy-agent/opa@"+opaVersion); err != nil {
			return err
		}
		o.opaBin = filepath.Join(tmp, "opa")
	}
	b.clientBin, b.opaBin = o.clientBin, o.opaBin
	if *memOnly {
		return b.memBench(os.Stdout, opaVersion)
	}
	if err := b.setupInline(o.inline); err != nil {
		return err
	}

	gen := filepath.Join(tmp, "gen")
	dataBytes, err := writeGenBundle(gen)
	if err != nil {
		return err
	}
	bundles := []bundleCase{
		{name: "example (examples/policy)", dir: o.example,
			probe: probe{method: "POST", path: "/v1/data/app/rbac", body: `{"input":{"user":"bob","action":"write","resource":"documents"}}`}},
		{name: fmt.Sprintf("generated (%d modules, %.1f MB data)", genModules, float64(dataBytes)/1e6), dir: gen,
			probe: probe{method: "GET", path: fmt.Sprintf("/v1/data/gen/m%04d/names", genModules-1)}},
	}
	var rows []startupRow
	for _, bc := range bundles {
		r, err := b.startups(bc, o.reps)
		if err != nil {
			return fmt.Errorf("%s: %w", bc.name, err)
		}
		rows = append(rows, r)
	}

	var tput []throughputRun
	if o.inline.duration > 0 {
		if tput, err = b.throughputs(bundles[0], o.inline); err != nil {
			return err
		}
	}
	if o.inline.skipLatency {
		reportInline(os.Stdout, o, opaVersion, rows, tput, b.clk.Since(wall))
		return nil
	}

	var lat []latencyRun
	for i := range o.latencyRuns {
		progress("latency run %d/%d: %d updates on the example bundle", i+1, o.latencyRuns, o.updates)
		r, err := b.latency(o.example, o.updates)
		if err != nil {
			return fmt.Errorf("latency run %d: %w", i+1, err)
		}
		lat = append(lat, r)
	}
	var large *latencyRun
	if o.largeUpdates > 0 {
		progress("latency: %d updates on the generated bundle", o.largeUpdates)
		r, err := b.latency(gen, o.largeUpdates)
		if err != nil {
			return fmt.Errorf("latency on the generated bundle: %w", err)
		}
		large = &r
	}

	report(os.Stdout, o, opaVersion, rows, lat, large, b.clk.Since(wall))
	if o.inline.consoleLogs || o.inline.duration > 0 {
		reportInline(os.Stdout, o, opaVersion, rows, tput, b.clk.Since(wall))
	}
	return nil
}

type bench struct {
	clk               clock.Clock
	tmp               string
	hc                *http.Client
	clientBin, opaBin string
	opaConfig         string // OPA configuration file given to both, "" = none
}

type bundleCase struct {
	name  string
	dir   string
	probe probe
}

// probe is one decision asked of both servers after ready: their answers
// must be equal, which shows both loaded the same content.
type probe struct{ method, path, body string }

type sample struct {
	ready time.Duration
	mem   procMem
}

type startupRow struct {
	bundle      string
	ours, opa   []sample
	probeAnswer int           // bytes of the (equal) decision answer
	serve       time.Duration // median time for the dev server to answer GET /policy (full bundle), read by this process
}

// startups starts each binary reps times on the bundle, alternating which
// goes first so a drift of the machine's speed hits both alike.
func (b *bench) startups(bc bundleCase, reps int) (startupRow, error) {
	row := startupRow{bundle: bc.name}
	_, url, stopSrv, err := b.devServer(bc.dir)
	if err != nil {
		return row, err
	}
	defer stopSrv()
	// What part of our start-up is the server's: build, send and read one
	// full bundle (ours also decodes it, as OPA decodes its files).
	var serve []float64
	for range 3 {
		t0 := b.clk.Now()
		if _, err := b.ask(url, probe{method: "GET", path: "/policy"}); err != nil {
			return row, err
		}
		serve = append(serve, float64(b.clk.Since(t0)))
	}
	row.serve = time.Duration(median(serve))
	var ourAnswer, opaAnswer []byte
	for i := range reps {
		progress("%s: start-up %d/%d", bc.name, i+1, reps)
		runOurs := func() error {
			p, err := b.startAgent(url)
			if err != nil {
				return err
			}
			defer p.stop()
			s, ans, err := b.measure(p, bc.probe)
			if err != nil {
				return fmt.Errorf("opal-client: %w", err)
			}
			row.ours, ourAnswer = append(row.ours, s), ans
			return nil
		}
		runOPA := func() error {
			p, err := b.startOPA(bc.dir)
			if err != nil {
				return err
			}
			defer p.stop()
			s, ans, err := b.measure(p, bc.probe)
			if err != nil {
				return fmt.Errorf("opa: %w", err)
			}
			row.opa, opaAnswer = append(row.opa, s), ans
			return nil
		}
		if err := alternate(i, runOurs, runOPA); err != nil {
			return row, err
		}
		if !jsonEqual(ourAnswer, opaAnswer) {
			return row, fmt.Errorf("the two servers answer %s differently:\nours %.300s\nopa  %.300s", bc.probe.path, ourAnswer, opaAnswer)
		}
		row.probeAnswer = len(ourAnswer)
	}
	return row, nil
}

// measure samples the resident memory of a ready process: memSamples reads
// memSampleEvery apart; the last VmRSS (after the start-up garbage has had a
// second to be collected) and the final VmHWM (peak) are kept. Then it asks
// the probe decision.
func (b *bench) measure(p *proc, pr probe) (sample, []byte, error) {
	s := sample{ready: p.readyAfter}
	for range memSamples {
		b.clk.Sleep(memSampleEvery)
		m, err := readProcMem(p.cmd.Process.Pid)
		if err != nil {
			return s, nil, err
		}
		s.mem = m
	}
	ans, err := b.ask(p.opaURL, pr)
	return s, ans, err
}

func (b *bench) ask(base string, pr probe) ([]byte, error) {
	req, err := http.NewRequest(pr.method, base+pr.path, strings.NewReader(pr.body))
	if err != nil {
		return nil, err
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %d %.200s", pr.method, pr.path, resp.StatusCode, body)
	}
	return body, nil
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	// Decision ids (present once decision logs are on) differ by design.
	for _, v := range []any{x, y} {
		if m, ok := v.(map[string]any); ok {
			delete(m, "decision_id")
		}
	}
	xa, _ := json.Marshal(x) // maps marshal with sorted keys
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// devServer serves dir with the dev server in this process on a loopback
// port. No polling: the latency run calls Rescan itself.
func (b *bench) devServer(dir string) (*devserver.Server, string, func(), error) {
	srv := devserver.New(devserver.Options{
		PolicyDir: dir, Clock: b.clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	stop := func() {
		srv.Close()
		ctx, cancel := b.clk.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}
	return srv, "http://" + ln.Addr().String(), stop, nil
}

// proc is a started child process.
type proc struct {
	name       string
	cmd        *exec.Cmd
	exited     chan struct{}
	log        string // its stderr, for the error message when it fails
	opaURL     string // where it serves OPA's REST API
	readyAfter time.Duration
	clk        clock.Clock
}

// startAgent starts `opal-client run` against the dev server at serverURL
// and waits until /ready answers 200. The data updater is off: OPA, its peer
// here, has none, and the dev server serves no data beyond the bundle's.
func (b *bench) startAgent(serverURL string) (*proc, error) {
	ports, err := child.FreePorts(2)
	if err != nil {
		return nil, err
	}
	apiPort, opaPort := ports[0], ports[1]
	cmd := exec.Command(b.clientBin, "run")
	inline, level := `OPAL_INLINE_OPA_CONFIG={"addr":"127.0.0.1:`+opaPort+`"}`, "OPAL_LOG_LEVEL=WARNING"
	if b.opaConfig != "" {
		// Decision logs are INFO records: the level lets them through.
		inline = `OPAL_INLINE_OPA_CONFIG={"addr":"127.0.0.1:` + opaPort + `","config_file":"` + b.opaConfig + `"}`
		level = "OPAL_LOG_LEVEL=INFO"
	}
	cmd.Env = child.Env(
		"OPAL_SERVER_URL="+serverURL,
		"OPAL_CLIENT_API_SERVER_PORT="+apiPort,
		inline,
		"OPAL_DATA_UPDATER_ENABLED=false",
		"OPAL_OPA_V0_COMPAT=false", // Rego v1, as its peer `opa run` parses
		"OPAL_LOG_SERIALIZE=true",
		level,
	)
	return b.start("opal-client", cmd, "http://127.0.0.1:"+apiPort+"/ready", "http://127.0.0.1:"+opaPort)
}

// startOPA starts `opa run --server` on the bundle directory and waits until
// /health?bundles answers 200.
func (b *bench) startOPA(dir string) (*proc, error) {
	ports, err := child.FreePorts(1)
	if err != nil {
		return nil, err
	}
	port := ports[0]
	base := "http://127.0.0.1:" + port
	args := []string{"run", "--server", "--addr", "127.0.0.1:" + port,
		"--disable-telemetry", "--log-level", "error", "--bundle", dir}
	if b.opaConfig != "" {
		args = append(args, "--config-file", b.opaConfig)
	}
	cmd := exec.Command(b.opaBin, args...)
	cmd.Env = child.Env()
	return b.start("opa", cmd, base+"/health?bundles", base)
}

func (b *bench) start(name string, cmd *exec.Cmd, readyURL, opaURL string) (*proc, error) {
	logf, err := os.CreateTemp(b.tmp, name+"-*.log")
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), log: logf.Name(), opaURL: opaURL, clk: b.clk}
	t0 := b.clk.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	if err := b.waitReady(p, readyURL); err != nil {
		p.stop()
		return nil, fmt.Errorf("%s: %w\n%s", name, err, tail(p.log))
	}
	p.readyAfter = b.clk.Since(t0)
	return p, nil
}

// waitReady polls url every readyPoll until it answers 200, the process
// exits, or readyBound passes.
func (b *bench) waitReady(p *proc, url string) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := b.clk.Now().Add(readyBound)
	for b.clk.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("exited before ready (%v)", p.cmd.ProcessState)
		default:
		}
		if resp, err := hc.Get(url); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		b.clk.Sleep(readyPoll)
	}
	return fmt.Errorf("not ready after %v", readyBound)
}

// stop sends SIGTERM to the process (by its PID) and waits for it; after 10 s
// it is killed.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-p.clk.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// latencyRun is one agent's notification-to-decision times.
type latencyRun struct {
	samples []time.Duration
	rescan  time.Duration // median time of a Rescan that finds nothing changed (read + hash of the directory)
}

// latency copies policyDir into a scratch directory with one extra module,
// bench/bench.rego (`package bench`, `v := N`), starts the dev server and an
// agent on it, and then, updates times: writes v := N+1, calls Rescan (which
// re-reads the directory and publishes the notification), and polls the
// embedded OPA's GET /v1/data/bench/v every decisionPoll until it answers
// the new value. The time is from just before Rescan to that answer.
func (b *bench) latency(policyDir string, updates int) (latencyRun, error) {
	var r latencyRun
	dir, err := os.MkdirTemp(b.tmp, "latency-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := copyTree(policyDir, dir); err != nil {
		return r, err
	}
	mod := filepath.Join(dir, "bench", "bench.rego")
	write := func(v int) error { return writeFile(mod, fmt.Sprintf("package bench\n\nv := %d\n", v)) }
	if err := write(0); err != nil {
		return r, err
	}
	srv, url, stopSrv, err := b.devServer(dir)
	if err != nil {
		return r, err
	}
	defer stopSrv()
	p, err := b.startAgent(url)
	if err != nil {
		return r, err
	}
	defer p.stop()
	if err := b.waitDecision(p.opaURL, 0); err != nil {
		return r, err
	}
	var idle []float64
	for range 5 {
		t0 := b.clk.Now()
		if _, err := srv.Rescan(); err != nil {
			return r, err
		}
		idle = append(idle, float64(b.clk.Since(t0)))
	}
	r.rescan = time.Duration(median(idle))
	for v := 1; v <= updates; v++ {
		if err := write(v); err != nil {
			return r, err
		}
		t0 := b.clk.Now()
		changed, err := srv.Rescan()
		if err != nil {
			return r, err
		}
		if !changed {
			return r, fmt.Errorf("update %d: the dev server saw no change", v)
		}
		if err := b.waitDecision(p.opaURL, v); err != nil {
			return r, fmt.Errorf("update %d: %w\n%s", v, err, tail(p.log))
		}
		r.samples = append(r.samples, b.clk.Since(t0))
	}
	return r, nil
}

// waitDecision polls data.bench.v until it is want.
func (b *bench) waitDecision(opaURL string, want int) error {
	deadline := b.clk.Now().Add(decisionBound)
	wantS := strconv.Itoa(want)
	last := ""
	for b.clk.Now().Before(deadline) {
		ans, err := b.ask(opaURL, probe{method: "GET", path: "/v1/data/bench/v"})
		if err == nil {
			var res struct {
				Result json.RawMessage `json:"result"`
			}
			if json.Unmarshal(ans, &res) == nil && string(res.Result) == wantS {
				return nil
			}
			last = string(ans)
		} else {
			last = err.Error()
		}
		b.clk.Sleep(decisionPoll)
	}
	return fmt.Errorf("data.bench.v is not %d after %v (last answer %.200s)", want, decisionBound, last)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sidecarbench: "+format+"\n", args...)
}

func output(name string, args ...string) (string, error) { return outputEnv(nil, name, args...) }

func outputEnv(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// alternate runs ours and opa in round i, the first of them alternating
// from round to round, so neither side always meets a warm or a cold
// machine first.
func alternate(i int, ours, opa func() error) error {
	first, second := ours, opa
	if i%2 == 1 {
		first, second = opa, ours
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}
