package fleetsim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// fmtDur renders a time from the recovery; "never" when not reached.
func fmtDur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// capLabel names a run's server capacity.
func capLabel(r Result) string {
	switch {
	case r.Capacity <= 0:
		return "unlimited"
	case r.Queue:
		return fmt.Sprintf("%d/s, queued", r.Capacity)
	}
	return fmt.Sprintf("%d/s", r.Capacity)
}

// WriteTable prints one scenario's results as a Markdown table, one policy
// and capacity a row.
func WriteTable(w io.Writer, sc Scenario, rs []Result) {
	n := 0
	if len(rs) > 0 {
		n = rs[0].Agents
	}
	fmt.Fprintf(w, "\n### (%s) %s\n\n", sc.Name, sc.Title)
	fmt.Fprintf(w, "%d agents; recovery at %s; run ends %s after it. Requests of every kind (policy, handshake, data) count in the peaks and the recovery peak/mean.\n\n", n, sc.Recovery(), sc.Tail)
	fmt.Fprintln(w, "| policy | server | policy req/agent in outage | handshakes/agent in outage | peak req/s (all) | peak policy/s | recovery peak/mean | to 50% | to 99% | to 100% | stale | late req/agent/min | policy / handshake / data per agent | 503 over capacity /agent | KB/agent | max fetches / requests per agent-second |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		late := "-"
		if r.LateRate >= 0 {
			late = fmt.Sprintf("%.2f", r.LateRate)
		}
		pm := "-"
		if r.RecoveryMean > 0 {
			pm = fmt.Sprintf("%d / %.1f = %.2f", r.RecoveryPeak, r.RecoveryMean, r.PeakMean())
		}
		fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %d | %d | %s | %s | %s | %s | %d | %s | %.1f / %.1f / %.1f | %.2f | %.1f | %d / %d |\n",
			r.Policy, capLabel(r), r.OutageRequests, r.OutageHandshakes, r.PeakRPS, r.PeakPolicy, pm,
			fmtDur(r.T50), fmtDur(r.T99), fmtDur(r.T100), r.Stale, late,
			r.PolicyReqs, r.Handshakes, r.Data, r.Refused, r.BytesPerAgent/1024, r.MaxAgentFetchesPerSec, r.MaxAgentRequestsPerSec)
	}
}

// Verdict is one target checked against one scenario's results.
type Verdict struct {
	Target   string
	Scenario string
	Pass     bool
	Detail   string // the measured figure against the target
}

func (v Verdict) String() string {
	s := "MISS"
	if v.Pass {
		s = "PASS"
	}
	return fmt.Sprintf("%s %s (%s): %s", s, v.Target, v.Scenario, v.Detail)
}

// find returns the result of policy p at capacity c (0: unlimited), not
// queued.
func find(rs []Result, p Policy, c int) (Result, bool) {
	for _, r := range rs {
		if r.Policy == p && r.Capacity == c && !r.Queue {
			return r, true
		}
	}
	return Result{}, false
}

// TargetCapacity is the capacity the fleet targets are judged at.
const TargetCapacity = 200

// Targets checks the fleet targets at TargetCapacity, our defaults against
// the peers, keyed by scenario name:
//
//	R1 (r): peak offered load, all kinds, at most 1,000/s
//	R2 (r): every agent resynced within 75 s
//	A0a (a0): policy requests per agent in the outage at most OPA polling's
//	A0b (a0): the last agent back within 60 s of the recovery
//	PM (a, c, s): recovery peak/mean at most 2
//	T100 (a, c, s): time to 100% no worse than any peer's that gets there
//	S1 (s): every agent resynced within 60 s of the return
//	S2 (s): fewer handshake attempts per agent in the outage than the Python client
//	N1 (n): at most 2 policy fetches per agent per second
//	N2 (n): the burst's last notification applied by every agent
func Targets(scs []Scenario, results map[string][]Result) []Verdict {
	var out []Verdict
	add := func(target, sc string, pass bool, format string, args ...any) {
		out = append(out, Verdict{target, sc, pass, fmt.Sprintf(format, args...)})
	}
	for _, sc := range scs {
		rs := results[sc.Name]
		o, ok := find(rs, Ours, TargetCapacity)
		if !ok {
			continue
		}
		py, _ := find(rs, PythonOPAL, TargetCapacity)
		opa, _ := find(rs, OPABundle, TargetCapacity)
		switch sc.Name {
		case "r":
			add("R1", sc.Name, o.PeakRPS <= 1000, "peak %d req/s (all kinds), target 1,000; python %d, opa %d", o.PeakRPS, py.PeakRPS, opa.PeakRPS)
			add("R2", sc.Name, o.Stale == 0 && o.T100 <= 75*time.Second, "last agent resynced at %s, target 75 s", fmtDur(o.T100))
		case "a0":
			add("A0a", sc.Name, o.OutageRequests <= opa.OutageRequests, "%.2f policy req/agent in the outage, opa %.2f", o.OutageRequests, opa.OutageRequests)
			add("A0b", sc.Name, o.Stale == 0 && o.T100 <= time.Minute, "last agent %s after recovery, target 60 s", fmtDur(o.T100))
		case "s":
			add("S1", sc.Name, o.Stale == 0 && o.T100 <= time.Minute, "last agent resynced %s after the return, target 60 s", fmtDur(o.T100))
			add("S2", sc.Name, o.OutageHandshakes < py.OutageHandshakes, "%.1f handshakes/agent in the outage, python %.1f", o.OutageHandshakes, py.OutageHandshakes)
		case "n":
			add("N1", sc.Name, o.MaxAgentFetchesPerSec <= 2, "at most %d policy fetches (%d requests, retries of 503s over capacity included) by one agent in one second, target 2 fetches",
				o.MaxAgentFetchesPerSec, o.MaxAgentRequestsPerSec)
			add("N2", sc.Name, o.Stale == 0, "%d agents without the last notification's policy", o.Stale)
		}
		switch sc.Name {
		case "a", "c", "s":
			add("PM", sc.Name, o.Stale == 0 && o.PeakMean() <= 2, "recovery peak/mean %.2f, target 2", o.PeakMean())
			pass, detail := o.Stale == 0, fmt.Sprintf("ours %s", fmtDur(o.T100))
			for _, b := range []Result{py, opa} {
				if b.Stale > 0 || b.T100 < 0 {
					detail += fmt.Sprintf("; %s does not get there (%d stale)", b.Policy, b.Stale)
					continue
				}
				detail += fmt.Sprintf("; %s %s", b.Policy, fmtDur(b.T100))
				if o.T100 > b.T100 {
					pass = false
				}
			}
			add("T100", sc.Name, pass, "%s", detail)
		}
	}
	return out
}

// svgColors are the line colours, by Policy.
var svgColors = map[Policy]string{
	Ours: "#1f77b4", OursNoJitter: "#d62728", OursOneAttempt: "#2ca02c", OursMaxRetryAfter120: "#8c564b", PythonOPAL: "#9467bd", OPABundle: "#ff7f0e",
}

// WriteSVG draws the server's requests per second over the first span of
// the run, one line per policy, on a log scale (log10(1+r/s)) so the
// thousands of a stampede and the tens of a spread-out fleet both show.
func WriteSVG(w io.Writer, sc Scenario, rs []Result, span time.Duration) error {
	const (
		width, height          = 960.0, 420.0 // room for the longest legend label
		left, right, top, bott = 70.0, 290.0, 40.0, 50.0
	)
	secs := int(span / time.Second)
	peak := 1
	for _, r := range rs {
		for _, c := range r.Timeline[:min(secs, len(r.Timeline))] {
			peak = max(peak, c)
		}
	}
	ymax := math.Ceil(math.Log10(float64(peak) + 1))
	pw, ph := width-left-right, height-top-bott
	x := func(s float64) float64 { return left + s/float64(secs)*pw }
	y := func(c int) float64 { return top + ph - math.Log10(float64(c)+1)/ymax*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="20" font-size="14">Scenario (%s): %s; %d agents; server requests per second (all kinds)</text>`+"\n", left, sc.Name, xmlEscape(sc.Title), agentsOf(rs))
	// Axes, grid and ticks.
	ticks := []int{0}
	for e := 0.0; e < ymax; e++ {
		ticks = append(ticks, int(math.Pow(10, e)))
	}
	for _, c := range ticks {
		yy := y(c)
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, left+pw, yy)
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end">%d</text>`+"\n", left-6, yy+4, c)
	}
	step := niceStep(secs)
	for s := 0; s <= secs; s += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`+"\n", x(float64(s)), top, x(float64(s)), top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%d</text>`+"\n", x(float64(s)), top+ph+16, s)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">seconds since the outage began</text>`+"\n", left+pw/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">requests in the second (log scale)</text>`+"\n", top+ph/2)
	rx := x(sc.Recovery().Seconds())
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="black" stroke-dasharray="4 3"/>`+"\n", rx, top, rx, top+ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%g">recovery</text>`+"\n", rx+4, top+12)
	// One step line per policy, and its legend entry.
	for i, r := range rs {
		var pts strings.Builder
		for s := 0; s < secs && s < len(r.Timeline); s++ {
			fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(float64(s)), y(r.Timeline[s]), x(float64(s+1)), y(r.Timeline[s]))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-opacity="0.85" points="%s"/>`+"\n", svgColors[r.Policy], strings.TrimSpace(pts.String()))
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/>`+"\n", left+pw+15, ly, left+pw+35, ly, svgColors[r.Policy])
		fmt.Fprintf(&b, `<text x="%g" y="%g">%s</text>`+"\n", left+pw+40, ly+4, xmlEscape(r.Policy.String()))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func agentsOf(rs []Result) int {
	if len(rs) == 0 {
		return 0
	}
	return rs[0].Agents
}

// niceStep picks a tick spacing giving at most about 10 ticks.
func niceStep(secs int) int {
	for _, s := range []int{1, 2, 5, 10, 15, 30, 60, 120, 300, 600} {
		if secs/s <= 10 {
			return s
		}
	}
	return 1200
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
