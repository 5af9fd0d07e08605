package main

// Memory while applying (docs/performance.md, "Memory while applying"): run
// with -mem-only. Each figure is beside `opa run --server` in the same run:
//
//   - peak RSS (VmHWM) while loading a bundle of S MB of data (few modules),
//     ours fetching it from the dev server, OPA loading it with --bundle;
//   - start to ready with 5,000 modules and 50 MB of data;
//   - VmRSS after -mem-deltas one-module deltas on the 1,000-module bundle,
//     against OPA's fresh VmRSS with the same bundle;
//   - the agent's VmHWM after it refused an endless chunked bundle body over
//     OPAL_POLICY_BUNDLE_MAX_BYTES.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/tools/child"
)

var (
	memOnly    = flag.Bool("mem-only", false, "run only the memory-while-applying measurements (see membench.go)")
	memApplyMB = flag.String("mem-apply-mb", "95,200", "data sizes (MB, comma-separated) of the peak-while-applying bundles")
	memReps    = flag.Int("mem-reps", 3, "start-ups of each binary per memory bundle")
	memDeltas  = flag.Int("mem-deltas", 100, "one-module deltas on the 1,000-module bundle before VmRSS is read")
	memLimitMB = flag.Int("mem-refuse-limit-mb", 100, "OPAL_POLICY_BUNDLE_MAX_BYTES (MiB) for the refused endless body")
	memParts   = flag.String("mem-parts", "apply,big,deltas,refused", "which memory measurements to run")
)

func memPart(name string) bool {
	for _, p := range strings.Split(*memParts, ",") {
		if strings.TrimSpace(p) == name {
			return true
		}
	}
	return false
}

// memRow is one bundle's start-ups of both binaries.
type memRow struct {
	name      string
	bodyBytes int // the dev server's GET /policy answer, what ours reads
	ours, opa []sample
}

// memBench runs the measurements and prints their tables.
func (b *bench) memBench(w io.Writer, opaVersion string) error {
	wall := b.clk.Now()
	var rows []memRow
	sizes, err := parseSizes(*memApplyMB)
	if err != nil {
		return err
	}
	for _, s := range sizes {
		if !memPart("apply") {
			break
		}
		dir := filepath.Join(b.tmp, fmt.Sprintf("apply-%dmb", s))
		n, err := writeSizedBundle(dir, 10, s, 1_000_000)
		if err != nil {
			return err
		}
		r, err := b.memStartups(fmt.Sprintf("%d modules, %.1f MB data", 10, float64(n)/1e6), dir,
			probe{method: "GET", path: "/v1/data/big/m0009/n"}, *memReps)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	var bigRow *memRow
	if memPart("big") {
		big := filepath.Join(b.tmp, "big")
		n, err := writeSizedBundle(big, 5000, 50, 1_000_000)
		if err != nil {
			return err
		}
		r, err := b.memStartups(fmt.Sprintf("5,000 modules, %.1f MB data", float64(n)/1e6), big,
			probe{method: "GET", path: "/v1/data/big/m4999/n"}, *memReps)
		if err != nil {
			return err
		}
		bigRow = &r
	}
	var deltas, fresh *procMem
	if memPart("deltas") {
		progress("mem: %d deltas on the 1,000-module bundle", *memDeltas)
		d, f, err := b.deltasRSS(*memDeltas)
		if err != nil {
			return err
		}
		deltas, fresh = &d, &f
		progress("mem: VmRSS after %d deltas %s, OPA fresh %s", *memDeltas, mb(d.RSS), mb(f.RSS))
	}
	var refused []refusal
	for _, e := range endlessBodies {
		if !memPart("refused") {
			break
		}
		progress("mem: refused endless body (%s) over %d MiB", e.name, *memLimitMB)
		r, err := b.refusedBody(int64(*memLimitMB)<<20, e)
		if err != nil {
			return err
		}
		refused = append(refused, r)
		progress("mem: refused: VmHWM %s, idle VmRSS %s, served %d bytes", mb(r.mem.HWM), mb(r.idle), r.read)
	}

	fmt.Fprintf(w, "Machine: %d CPUs (%s), %s/%s, %s; OPA %s. Wall time of the run: %.0f s.\n\n",
		runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), opaVersion, b.clk.Since(wall).Seconds())
	fmt.Fprintf(w, "Median of %d start-ups of each binary, alternating which goes first.\n\n", *memReps)
	fmt.Fprintln(w, "| bundle | measure | `opal-client run` | `opa run --server` | ours / OPA | target | verdict |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | --- | --- |")
	hwm := func(s sample) float64 { return float64(s.mem.HWM) }
	rss := func(s sample) float64 { return float64(s.mem.RSS) }
	ready := func(s sample) float64 { return float64(s.ready) }
	for _, r := range rows {
		o, p := uint64(median(durs(r.ours, hwm))), uint64(median(durs(r.opa, hwm)))
		fmt.Fprintf(w, "| %s (body %.1f MB) | peak RSS (VmHWM) loading it | %s | %s | %.2fx | <= 1.00x | %s |\n",
			r.name, float64(r.bodyBytes)/1e6, mb(o), mb(p), float64(o)/float64(p), verdict(o <= p))
		o, p = uint64(median(durs(r.ours, rss))), uint64(median(durs(r.opa, rss)))
		fmt.Fprintf(w, "| %s | VmRSS after ready | %s | %s | %.2fx | - | - |\n", r.name, mb(o), mb(p), float64(o)/float64(p))
	}
	if bigRow != nil {
		or, pr := time.Duration(median(durs(bigRow.ours, ready))), time.Duration(median(durs(bigRow.opa, ready)))
		fmt.Fprintf(w, "| %s | start to ready | %s | %s | %.2fx | <= 1.10x | %s |\n",
			bigRow.name, ms(or), ms(pr), float64(or)/float64(pr), verdict(float64(or) <= 1.1*float64(pr)))
		o, p := uint64(median(durs(bigRow.ours, hwm))), uint64(median(durs(bigRow.opa, hwm)))
		fmt.Fprintf(w, "| %s | peak RSS (VmHWM) | %s | %s | %.2fx | - | - |\n", bigRow.name, mb(o), mb(p), float64(o)/float64(p))
		rows = append(rows, *bigRow)
	}
	if deltas != nil {
		fmt.Fprintf(w, "| 1,000 modules, 10 MB data | VmRSS after %d one-module deltas (OPA: fresh) | %s | %s | %.2fx | <= 1.00x | %s |\n",
			*memDeltas, mb(deltas.RSS), mb(fresh.RSS), float64(deltas.RSS)/float64(fresh.RSS), verdict(deltas.RSS <= fresh.RSS))
	}
	for _, r := range refused {
		fmt.Fprintf(w, "| endless chunked body (%s), limit %d MiB | agent VmHWM after the refusal (served %.1f MB, %d requests) | %s | - | - | VmHWM - idle VmRSS (%s) <= limit | %s |\n",
			r.body, *memLimitMB, float64(r.read)/1e6, r.requests, mb(r.mem.HWM), mb(r.idle),
			verdict(r.mem.HWM-r.idle <= uint64(*memLimitMB)<<20))
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "- %s: ours %s; OPA %s (ready ms / VmHWM MB)\n", r.name, memRuns(r.ours), memRuns(r.opa))
	}
	return nil
}

func memRuns(ss []sample) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, fmt.Sprintf("%.0f/%.1f", float64(s.ready)/1e6, float64(s.mem.HWM)/1e6))
	}
	return strings.Join(parts, ", ")
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-mem-apply-mb: bad size %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// writeSizedBundle writes a policy directory of modules modules (package
// big.mNNNN, each reading one data document) and about dataMB MB of data in
// documents of docBytes (dNNN/data.json). It returns the data bytes written.
func writeSizedBundle(dir string, modules, dataMB, docBytes int) (int, error) {
	docs := max(dataMB*1_000_000/docBytes, 1)
	for i := range modules {
		d := i % docs
		m := fmt.Sprintf("package big.m%04d\n\nn := count(data.d%03d.records)\n\nowners contains r.owner if {\n\tsome r in data.d%03d.records\n\tr.n == %d\n}\n", i, d, d, i)
		if err := writeFile(filepath.Join(dir, "big", fmt.Sprintf("m%04d", i), "policy.rego"), m); err != nil {
			return 0, err
		}
	}
	n := 0
	for d := range docs {
		var sb strings.Builder
		sb.WriteString(`{"records":[`)
		for r := 0; sb.Len() < docBytes; r++ {
			if r > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"name":"rec-%d-%d","owner":"user%d","tags":["a","b","c"],"n":%d}`, d, r, r%1000, r)
		}
		sb.WriteString("]}")
		n += sb.Len()
		if err := writeFile(filepath.Join(dir, fmt.Sprintf("d%03d", d), "data.json"), sb.String()); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// memStartups is startups with the agent's bundle size limit raised above
// the bundle (the default 100 MiB would refuse the larger ones).
func (b *bench) memStartups(name, dir string, pr probe, reps int) (memRow, error) {
	row := memRow{name: name}
	_, url, stopSrv, err := b.devServer(dir)
	if err != nil {
		return row, err
	}
	defer stopSrv()
	// The dev server builds a large bundle for each request: more than the
	// default client's 5 s.
	resp, err := (&http.Client{Timeout: 5 * time.Minute}).Get(url + "/policy")
	if err != nil {
		return row, err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return row, fmt.Errorf("GET /policy: %d, %v", resp.StatusCode, err)
	}
	row.bodyBytes = int(n)
	limit := "OPAL_POLICY_BUNDLE_MAX_BYTES=" + strconv.Itoa(row.bodyBytes*2)
	var ourAnswer, opaAnswer []byte
	for i := range reps {
		progress("mem %s: start-up %d/%d", name, i+1, reps)
		runOurs := func() error {
			p, err := b.startAgentEnv(url, limit)
			if err != nil {
				return err
			}
			defer p.stop()
			s, ans, err := b.measure(p, pr)
			if err != nil {
				return fmt.Errorf("opal-client: %w", err)
			}
			row.ours, ourAnswer = append(row.ours, s), ans
			return nil
		}
		runOPA := func() error {
			p, err := b.startOPA(dir)
			if err != nil {
				return err
			}
			defer p.stop()
			s, ans, err := b.measure(p, pr)
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
			return row, fmt.Errorf("%s: the two servers answer differently:\nours %.300s\nopa  %.300s", name, ourAnswer, opaAnswer)
		}
		progress("mem %s: ours %s, OPA %s (ready ms / VmHWM MB)", name, memRuns(row.ours), memRuns(row.opa))
	}
	return row, nil
}

// startAgentEnv is startAgent with extra environment.
func (b *bench) startAgentEnv(serverURL string, extra ...string) (*proc, error) {
	ports, err := child.FreePorts(2)
	if err != nil {
		return nil, err
	}
	apiPort, opaPort := ports[0], ports[1]
	cmd := exec.Command(b.clientBin, "run")
	cmd.Env = child.Env(append([]string{
		"OPAL_SERVER_URL=" + serverURL,
		"OPAL_CLIENT_API_SERVER_PORT=" + apiPort,
		`OPAL_INLINE_OPA_CONFIG={"addr":"127.0.0.1:` + opaPort + `"}`,
		"OPAL_DATA_UPDATER_ENABLED=false",
		"OPAL_LOG_LEVEL=WARNING",
	}, extra...)...)
	return b.start("opal-client", cmd, "http://127.0.0.1:"+apiPort+"/ready", "http://127.0.0.1:"+opaPort)
}

// deltasRSS applies n one-module deltas to the 1,000-module bundle (plus
// bench/bench.rego, rewritten each time) and returns the agent's memory
// after them, and OPA's fresh memory with the same directory.
func (b *bench) deltasRSS(n int) (procMem, procMem, error) {
	var ours, opa procMem
	dir := filepath.Join(b.tmp, "deltas")
	if _, err := writeGenBundle(dir); err != nil {
		return ours, opa, err
	}
	mod := filepath.Join(dir, "bench", "bench.rego")
	write := func(v int) error { return writeFile(mod, fmt.Sprintf("package bench\n\nv := %d\n", v)) }
	if err := write(0); err != nil {
		return ours, opa, err
	}
	srv, url, stopSrv, err := b.devServer(dir)
	if err != nil {
		return ours, opa, err
	}
	defer stopSrv()
	p, err := b.startAgent(url)
	if err != nil {
		return ours, opa, err
	}
	if err := b.waitDecision(p.opaURL, 0); err != nil {
		p.stop()
		return ours, opa, err
	}
	for v := 1; v <= n; v++ {
		if err := write(v); err != nil {
			p.stop()
			return ours, opa, err
		}
		if _, err := srv.Rescan(); err != nil {
			p.stop()
			return ours, opa, err
		}
		if err := b.waitDecision(p.opaURL, v); err != nil {
			p.stop()
			return ours, opa, fmt.Errorf("delta %d: %w", v, err)
		}
	}
	s, _, err := b.measure(p, probe{method: "GET", path: "/v1/data/bench/v"})
	p.stop()
	if err != nil {
		return ours, opa, err
	}
	ours = s.mem
	if err := write(0); err != nil {
		return ours, opa, err
	}
	q, err := b.startOPA(dir)
	if err != nil {
		return ours, opa, err
	}
	defer q.stop()
	s, _, err = b.measure(q, probe{method: "GET", path: "/v1/data/bench/v"})
	return ours, s.mem, err
}

// endlessBody is an unending bundle body: head once, then fill forever.
type endlessBody struct{ name, head, fill string }

var endlessBodies = []endlessBody{
	{"one data module that never ends", `{"manifest":[],"hash":"h","policy_modules":[],"data_modules":[{"path":".","data":"`, strings.Repeat("x", 64<<10)},
	{"data modules without end", `{"manifest":[],"hash":"h","policy_modules":[],"data_modules":[`, strings.Repeat(`{"path":"a","data":"{\"k\":1}"},`, 2048)},
}

type refusal struct {
	body     string
	mem      procMem
	idle     uint64 // VmRSS before the policy fetch was let through
	read     int64  // body bytes the agent took before it closed the connection
	requests int
}

// refusedBody starts an agent whose dev server answers GET /policy with an
// endless chunked body, and reads the agent's memory after it refused it.
// The answer waits until the agent's idle VmRSS was read.
func (b *bench) refusedBody(limit int64, e endlessBody) (refusal, error) {
	r := refusal{body: e.name}
	dir := filepath.Join(b.tmp, "refuse")
	if err := writeFile(filepath.Join(dir, "p.rego"), "package p\n\nx := 1\n"); err != nil {
		return r, err
	}
	srv := devserver.New(devserver.Options{PolicyDir: dir, Clock: b.clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer srv.Close()
	gate := make(chan struct{})
	done := make(chan struct{}, 16)
	var written, requests atomic.Int64
	head, fill := []byte(e.head), []byte(e.fill)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/policy" {
			srv.ServeHTTP(w, req)
			return
		}
		requests.Add(1)
		defer func() { done <- struct{}{} }()
		select {
		case <-gate:
		case <-req.Context().Done():
			return
		}
		w.WriteHeader(http.StatusOK)
		n, _ := w.Write(head)
		written.Add(int64(n))
		for {
			n, err := w.Write(fill)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})}
	go func() { _ = hs.Serve(ln) }()
	defer func() {
		ctx, cancel := b.clk.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}()
	ports, err := child.FreePorts(2)
	if err != nil {
		return r, err
	}
	apiPort, opaPort := ports[0], ports[1]
	cmd := exec.Command(b.clientBin, "run")
	cmd.Env = child.Env("OPAL_SERVER_URL=http://"+ln.Addr().String(), "OPAL_CLIENT_API_SERVER_PORT="+apiPort,
		`OPAL_INLINE_OPA_CONFIG={"addr":"127.0.0.1:`+opaPort+`"}`, "OPAL_DATA_UPDATER_ENABLED=false",
		"OPAL_LOG_LEVEL=WARNING", "OPAL_POLICY_BUNDLE_MAX_BYTES="+strconv.FormatInt(limit, 10))
	logf, err := os.CreateTemp(b.tmp, "refuse-*.log")
	if err != nil {
		return r, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return r, err
	}
	p := &proc{name: "opal-client", cmd: cmd, exited: make(chan struct{}), log: logf.Name(), clk: b.clk}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	defer p.stop()
	// Idle: up and asking for its policy, nothing received yet.
	for requests.Load() == 0 {
		select {
		case <-p.exited:
			return r, fmt.Errorf("agent exited: %s", tail(p.log))
		case <-b.clk.After(10 * time.Millisecond):
		}
	}
	b.clk.Sleep(time.Second)
	idle, err := readProcMem(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	r.idle = idle.RSS
	close(gate)
	select {
	case <-done:
	case <-b.clk.After(2 * time.Minute):
		return r, fmt.Errorf("the agent never closed the endless body:\n%s", tail(p.log))
	}
	b.clk.Sleep(2 * time.Second) // a retry, if any, would start here
	r.mem, err = readProcMem(cmd.Process.Pid)
	r.read, r.requests = written.Load(), int(requests.Load())
	return r, err
}
