package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"
)

// verdict is PASS or MISS; a missed target is printed as plainly as a met one.
func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// startupVerdict: ready within startupTarget of OPA's own ready time (OPA's
// time is its start plus loading and compiling the bundle).
func startupVerdict(ours, opa time.Duration) string {
	return verdict(ours-opa < startupTarget)
}

// memVerdict: our resident memory within 1.15 times OPA's (integer percent,
// so exactly 1.15x is not lost to float rounding).
func memVerdict(ours, opa uint64) string {
	return verdict(ours*100 <= opa*memTargetPct)
}

// latencyVerdict: p99 notification-to-decision under latencyTarget.
func latencyVerdict(p99 time.Duration) string {
	return verdict(p99 < latencyTarget)
}

func durs(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func report(w io.Writer, o options, opaVersion string, rows []startupRow, lat []latencyRun, large *latencyRun, wall time.Duration) {
	fmt.Fprintf(w, "Machine: %d CPUs (%s), %s/%s, %s; OPA %s built from the module pinned in go.mod. Wall time of the run: %.0f s.\n\n",
		runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), opaVersion, wall.Seconds())

	fmt.Fprintf(w, "Start-up and memory: median of %d start-ups of each, the two alternating.\n\n", o.reps)
	fmt.Fprintln(w, "| bundle | measure | `opal-client run` | `opa run --server` | ours / OPA | target | verdict |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | --- | --- |")
	for _, r := range rows {
		ready := func(s sample) float64 { return float64(s.ready) }
		rss := func(s sample) float64 { return float64(s.mem.RSS) }
		hwm := func(s sample) float64 { return float64(s.mem.HWM) }
		or, pr := time.Duration(median(durs(r.ours, ready))), time.Duration(median(durs(r.opa, ready)))
		om, pm := uint64(median(durs(r.ours, rss))), uint64(median(durs(r.opa, rss)))
		oh, ph := uint64(median(durs(r.ours, hwm))), uint64(median(durs(r.opa, hwm)))
		fmt.Fprintf(w, "| %s | start to ready | %s | %s | %.2fx | ours - OPA < 300 ms (here %+.0f ms) | %s |\n",
			r.bundle, ms(or), ms(pr), float64(or)/float64(pr), float64(or-pr)/1e6, startupVerdict(or, pr))
		fmt.Fprintf(w, "| %s | VmRSS after ready | %s | %s | %.2fx | <= %.2fx | %s |\n",
			r.bundle, mb(om), mb(pm), float64(om)/float64(pm), float64(memTargetPct)/100, memVerdict(om, pm))
		fmt.Fprintf(w, "| %s | VmHWM (peak RSS) | %s | %s | %.2fx | - | - |\n",
			r.bundle, mb(oh), mb(ph), float64(oh)/float64(ph))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Each start-up (ready ms / VmRSS MB):")
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "- %s: ours %s; OPA %s. Ours includes the fetch: the dev server's full-bundle answer alone (GET /policy, read by the benchmark) takes %s.\n",
			r.bundle, runs(r.ours), runs(r.opa), ms(r.serve))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Notification-to-decision: the dev server publishes a one-module change; time until the embedded OPA answers the new decision (1 ms polling).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| bundle | updates x runs | p50 | p99 | max | dev server rescan (included) | target | verdict |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
	var p50s, p99s, maxs, rescans []float64
	for _, r := range lat {
		p50s = append(p50s, float64(percentile(r.samples, 50)))
		p99s = append(p99s, float64(percentile(r.samples, 99)))
		maxs = append(maxs, float64(percentile(r.samples, 100)))
		rescans = append(rescans, float64(r.rescan))
	}
	p99 := time.Duration(median(p99s))
	fmt.Fprintf(w, "| example + 1 module | %d x %d | %s | %s | %s | %s | p99 < 25 ms | %s |\n",
		o.updates, len(lat), ms(time.Duration(median(p50s))), ms(p99), ms(time.Duration(median(maxs))),
		ms(time.Duration(median(rescans))), latencyVerdict(p99))
	if large != nil {
		fmt.Fprintf(w, "| generated + 1 module | %d x 1 | %s | %s | %s | %s | none (whole-set recompile) | - |\n",
			len(large.samples), ms(percentile(large.samples, 50)), ms(percentile(large.samples, 99)),
			ms(percentile(large.samples, 100)), ms(large.rescan))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Medians over the runs; per run (p50 / p99 ms): %s\n", latRuns(p50s, p99s))
}

func runs(ss []sample) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, fmt.Sprintf("%.0f/%.1f", float64(s.ready)/1e6, float64(s.mem.RSS)/1e6))
	}
	return strings.Join(parts, ", ")
}

func latRuns(p50s, p99s []float64) string {
	var parts []string
	for i := range p50s {
		parts = append(parts, fmt.Sprintf("%.1f / %.1f", p50s[i]/1e6, p99s[i]/1e6))
	}
	return strings.Join(parts, ", ")
}
