package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The inline OPA comparison: both servers with the same OPA
// configuration file (decision logs on the console), their resident memory
// with the example and the generated bundle, and the decision throughput of
// each on the example policy under the same load.

// Targets of the inline OPA comparison (docs/performance.md).
const (
	inlineMemTargetPct  = 100 // our VmRSS <= 1.0 x OPA's, with the same config file
	throughputTargetPct = 95  // our decisions/s >= 0.95 x OPA's
)

type inlineOptions struct {
	consoleLogs bool
	duration    time.Duration
	concurrency int
	runs        int
	skipLatency bool
}

func (o *inlineOptions) flags() {
	flag.BoolVar(&o.consoleLogs, "console-decision-logs", false, "give both servers an OPA config file with decision_logs: {console: true}")
	flag.DurationVar(&o.duration, "throughput", 0, "measure decision throughput on the example policy for this long per run (0: skip)")
	flag.IntVar(&o.concurrency, "concurrency", 4, "concurrent clients of the throughput load generator")
	flag.IntVar(&o.runs, "throughput-runs", 2, "throughput runs of each server, alternating")
	flag.BoolVar(&o.skipLatency, "skip-latency", false, "skip the notification-to-decision runs (print the inline OPA section only)")
}

// setupInline writes the shared OPA configuration file.
func (b *bench) setupInline(o inlineOptions) error {
	if !o.consoleLogs {
		return nil
	}
	b.opaConfig = filepath.Join(b.tmp, "opa-config.yaml")
	return os.WriteFile(b.opaConfig, []byte("decision_logs:\n  console: true\n"), 0o600)
}

type throughputRun struct {
	name      string
	decisions int64
	errors    int64
	took      time.Duration
}

func (r throughputRun) rate() float64 { return float64(r.decisions) / r.took.Seconds() }

// throughputs starts each server on the bundle o.runs times, alternating,
// and drives each with the load generator.
func (b *bench) throughputs(bc bundleCase, o inlineOptions) ([]throughputRun, error) {
	_, url, stopSrv, err := b.devServer(bc.dir)
	if err != nil {
		return nil, err
	}
	defer stopSrv()
	var out []throughputRun
	for i := range o.runs {
		order := []string{"ours", "opa"}
		if i%2 == 1 {
			order = []string{"opa", "ours"}
		}
		for _, who := range order {
			progress("throughput %s %d/%d: %v, %d clients", who, i+1, o.runs, o.duration, o.concurrency)
			var p *proc
			if who == "ours" {
				p, err = b.startAgent(url)
			} else {
				p, err = b.startOPA(bc.dir)
			}
			if err != nil {
				return nil, err
			}
			r := b.load(p.opaURL, bc.probe, o.duration, o.concurrency)
			r.name = who
			p.stop()
			if r.errors > 0 {
				return nil, fmt.Errorf("%s: %d decisions failed", who, r.errors)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// load is the Go load generator: conc clients, each asking the probe
// decision in a loop over a kept-alive connection, for d.
func (b *bench) load(base string, pr probe, d time.Duration, conc int) throughputRun {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var n, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	t0 := b.clk.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				resp, err := hc.Post(base+pr.path, "application/json", strings.NewReader(pr.body))
				if err != nil {
					errs.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs.Add(1)
					continue
				}
				n.Add(1)
			}
		}()
	}
	b.clk.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return throughputRun{decisions: n.Load(), errors: errs.Load(), took: b.clk.Since(t0)}
}

func reportInline(w io.Writer, o options, opaVersion string, rows []startupRow, tput []throughputRun, wall time.Duration) {
	fmt.Fprintf(w, "\nInline OPA: %d CPUs (%s), %s, OPA %s; both servers run with the same OPA config file (%s). Wall time so far: %.0f s.\n\n",
		runtime.NumCPU(), cpuModel(), runtime.Version(), opaVersion, configDesc(o.inline), wall.Seconds())
	fmt.Fprintln(w, "| bundle | measure | `opal-client run` | `opa run --server` | ours / OPA | target | verdict |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | --- | --- |")
	for _, r := range rows {
		rss := func(s sample) float64 { return float64(s.mem.RSS) }
		om, pm := uint64(median(durs(r.ours, rss))), uint64(median(durs(r.opa, rss)))
		fmt.Fprintf(w, "| %s | VmRSS after ready (median of %d) | %s | %s | %.2fx | <= 1.00x | %s |\n",
			r.bundle, o.reps, mb(om), mb(pm), float64(om)/float64(pm), verdict(om*100 <= pm*inlineMemTargetPct))
	}
	if len(tput) > 0 {
		var ours, theirs []float64
		for _, r := range tput {
			if r.name == "ours" {
				ours = append(ours, r.rate())
			} else {
				theirs = append(theirs, r.rate())
			}
		}
		om, pm := median(ours), median(theirs)
		fmt.Fprintf(w, "| example | decisions/s (%v, %d clients, median of %d) | %.0f | %.0f | %.2fx | >= 0.95x | %s |\n",
			o.inline.duration, o.inline.concurrency, len(ours), om, pm, om/pm, verdict(om*100 >= pm*throughputTargetPct))
		fmt.Fprintln(w)
		var parts []string
		for _, r := range tput {
			parts = append(parts, fmt.Sprintf("%s %.0f", r.name, r.rate()))
		}
		fmt.Fprintf(w, "Throughput runs in order (decisions/s): %s.\n", strings.Join(parts, ", "))
	}
}

func configDesc(o inlineOptions) string {
	if o.consoleLogs {
		return "`decision_logs: {console: true}`"
	}
	return "none"
}
