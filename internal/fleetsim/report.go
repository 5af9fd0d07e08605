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

// WriteTable prints one scenario's results as a Markdown table, one policy
// a row.
func WriteTable(w io.Writer, sc Scenario, rs []Result) {
	n := 0
	if len(rs) > 0 {
		n = rs[0].Agents
	}
	fmt.Fprintf(w, "\n### (%s) %s\n\n", sc.Name, sc.Title)
	fmt.Fprintf(w, "%d agents; recovery at %s; run ends %s after it.\n\n", n, sc.Recovery(), sc.Tail)
	fmt.Fprintln(w, "| policy | req/agent in outage | peak req/s | recovery peak/mean | to 50% | to 99% | to 100% | stale at end | late-outage req/agent/min |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rs {
		late := "-"
		if r.LateRate >= 0 {
			late = fmt.Sprintf("%.2f", r.LateRate)
		}
		pm := "-"
		if r.RecoveryMean > 0 {
			pm = fmt.Sprintf("%d / %.1f = %.2f", r.RecoveryPeak, r.RecoveryMean, r.PeakMean())
		}
		fmt.Fprintf(w, "| %s | %.2f | %d | %s | %s | %s | %s | %d | %s |\n",
			r.Policy, r.OutageRequests, r.PeakRPS, pm, fmtDur(r.T50), fmtDur(r.T99), fmtDur(r.T100), r.Stale, late)
	}
}

// Verdict is one target of issue 8 checked against one scenario's results.
type Verdict struct {
	Target   string // T1..T4
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

func find(rs []Result, p Policy) (Result, bool) {
	for _, r := range rs {
		if r.Policy == p {
			return r, true
		}
	}
	return Result{}, false
}

// Targets checks the targets of issue 8 part 2 against the results, keyed
// by scenario name:
//
//	T1 (a, b): every agent holds the new policy within max(Retry-After, 60 s) + 60 s of recovery
//	T2 (a, b): fewer requests per agent in the outage than every baseline that recovers (all agents)
//	T3 (outages of 10 min or more): at most 1.4 requests per agent per minute late in the outage
//	T4 (every scenario where we recover without an event): recovery peak/mean at most 2,
//	    and worse without jitter
func Targets(scs []Scenario, results map[string][]Result) []Verdict {
	var out []Verdict
	for _, sc := range scs {
		rs := results[sc.Name]
		o, ok := find(rs, Ours)
		if !ok {
			continue
		}
		if sc.Name == "a" || sc.Name == "b" {
			limit := max(sc.HintRetryAfter, time.Minute) + time.Minute
			out = append(out, Verdict{"T1", sc.Name, o.T100 >= 0 && o.T100 <= limit,
				fmt.Sprintf("last agent %s after recovery, target %s", fmtDur(o.T100), fmtDur(limit))})
			pass, detail := true, fmt.Sprintf("ours %.2f req/agent", o.OutageRequests)
			for _, p := range []Policy{PythonOPAL, OPABundle} {
				b, ok := find(rs, p)
				if !ok {
					continue
				}
				if b.Stale > 0 {
					detail += fmt.Sprintf("; %s does not recover (%d stale)", p, b.Stale)
					continue
				}
				detail += fmt.Sprintf("; %s %.2f", p, b.OutageRequests)
				if o.OutageRequests >= b.OutageRequests {
					pass = false
				}
			}
			out = append(out, Verdict{"T2", sc.Name, pass, detail})
		}
		if o.LateRate >= 0 {
			out = append(out, Verdict{"T3", sc.Name, o.LateRate <= 1.4,
				fmt.Sprintf("%.2f req/agent/min in the last 5 min of the outage, target 1.4", o.LateRate)})
		}
		if !sc.Notify && o.Stale == 0 {
			nj, _ := find(rs, OursNoJitter)
			out = append(out, Verdict{"T4", sc.Name, o.PeakMean() <= 2 && nj.PeakMean() > o.PeakMean(),
				fmt.Sprintf("peak/mean %.2f with jitter (target 2), %.2f without", o.PeakMean(), nj.PeakMean())})
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
	fmt.Fprintf(&b, `<text x="%g" y="20" font-size="14">Scenario (%s): %s; %d agents; server requests per second</text>`+"\n", left, sc.Name, xmlEscape(sc.Title), agentsOf(rs))
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
