// Package fleetsim simulates a fleet of agents against one OPAL server during
// an outage (issue 8): N agents, one in-memory server whose answers follow a
// scenario's phases, and a virtual clock. Our agents run the project's real
// code, unchanged: fetcher (classification F1, waits F4, whole-fetch bound F7)
// behind an in-memory http.RoundTripper, scheduler (D1-D8), and the serial
// update queue (updater) writing an internal/memstore store. The peers'
// published retry behaviour (the Python OPAL client on master and OPA's
// bundle downloader) runs beside it as baselines, modelled from their source.
//
// Run needs virtual time: call it inside a testing/synctest bubble, where
// clock.New() and every timer are virtual, so 30 simulated minutes of 10,000
// agents take seconds. On a real clock it would take the simulated time.
package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/internal/pubsub"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// Policy is a retry policy simulated for every agent of one run.
type Policy int

// The simulated policies, in table order.
const (
	Ours         Policy = iota // this project at its defaults
	OursNoJitter               // the same with the deferral jitter (D2) and the Retry-After spread (F4) off
	PythonOPAL                 // the Python client on master (protocol §8)
	OPABundle                  // OPA's bundle downloader, polling
	// OursOneAttempt is ours with OPAL_POLICY_UPDATER_CONN_RETRY attempts=1:
	// a configuration, not the default, shown because every fetch then
	// defers through the jittered scheduler instead of retrying in-fetch.
	OursOneAttempt
	// OursMaxRetryAfter120 is ours with OPAL_POLICY_UPDATER_MAX_RETRY_AFTER
	// 120: a configuration, not the default, shown because it is the
	// operator's lever on D3's flat cadence (fewer requests, slower recovery).
	OursMaxRetryAfter120
)

// Policies lists every Policy, in table order.
var Policies = []Policy{Ours, OursNoJitter, OursOneAttempt, OursMaxRetryAfter120, PythonOPAL, OPABundle}

func (p Policy) String() string {
	switch p {
	case Ours:
		return "ours"
	case OursNoJitter:
		return "ours, no jitter"
	case PythonOPAL:
		return "python opal (master)"
	case OPABundle:
		return "opa bundle polling"
	case OursOneAttempt:
		return "ours, attempts=1 (config)"
	case OursMaxRetryAfter120:
		return "ours, MAX_RETRY_AFTER=120 (config)"
	}
	return "unknown"
}

// Phase is one stretch of the outage: until Until (from the start) the
// server answers every policy request with Status and, when set, the
// Retry-After header RetryAfter.
type Phase struct {
	Until      time.Duration
	Status     int
	RetryAfter string
}

// Scenario is one outage. The server's policy hash changes at the start; it
// can serve the new policy only after the last phase (the recovery).
type Scenario struct {
	Name   string // short id: a, b, ...
	Title  string
	Phases []Phase
	// Tail is how long the simulation runs after the recovery.
	Tail time.Duration
	// Notify publishes a policy notification at the recovery. Without it
	// agents must recover on their own: that is the point of most scenarios.
	Notify bool
	// HintRetryAfter is the Retry-After the target "every agent within
	// max(Retry-After, 60 s) + 60 s of recovery" uses; 0 if none.
	HintRetryAfter time.Duration
}

// Recovery is when the server starts serving the new policy.
func (s Scenario) Recovery() time.Duration {
	if len(s.Phases) == 0 {
		return 0
	}
	return s.Phases[len(s.Phases)-1].Until
}

// End is when the simulation stops.
func (s Scenario) End() time.Duration { return s.Recovery() + s.Tail }

// Scenarios are the outages of issue 8, (a) to (e), plus (d+): (d) with the
// notification a server publishes once the branch resolves.
func Scenarios() []Scenario {
	const tail = 10 * time.Minute
	return []Scenario{
		{Name: "a", Title: "clone: 503 Retry-After 30 for 45 s, then serves",
			Phases: []Phase{{45 * time.Second, http.StatusServiceUnavailable, "30"}}, Tail: tail, HintRetryAfter: 30 * time.Second},
		{Name: "b", Title: "503 Retry-After 5 for 20 min",
			Phases: []Phase{{20 * time.Minute, http.StatusServiceUnavailable, "5"}}, Tail: tail, HintRetryAfter: 5 * time.Second},
		{Name: "c", Title: "503 without Retry-After for 20 min",
			Phases: []Phase{{20 * time.Minute, http.StatusServiceUnavailable, ""}}, Tail: tail},
		{Name: "d", Title: "409 for 5 min, then ready (no notification)",
			Phases: []Phase{{5 * time.Minute, http.StatusConflict, ""}}, Tail: tail},
		{Name: "d+", Title: "409 for 5 min, then ready with a policy notification",
			Phases: []Phase{{5 * time.Minute, http.StatusConflict, ""}}, Tail: tail, Notify: true},
		{Name: "e", Title: "503 without Retry-After for 5 min, then Retry-After 99999 for 10 min",
			Phases: []Phase{
				{5 * time.Minute, http.StatusServiceUnavailable, ""},
				{15 * time.Minute, http.StatusServiceUnavailable, "99999"},
			}, Tail: tail},
	}
}

// Config sizes a run.
type Config struct {
	Agents int    // 0 means 10,000
	Seed   uint64 // seeds every agent's random source
}

// Result holds one policy's figures for one scenario. Durations are on the
// virtual clock; times "to N%" run from the recovery and are -1 when never
// reached.
type Result struct {
	Scenario string
	Policy   Policy
	Agents   int
	// OutageRequests is the requests per agent before the recovery.
	OutageRequests float64
	// PeakRPS is the largest count of requests in a 1 s window of the run.
	PeakRPS int
	// RecoveryPeak and RecoveryMean are the largest 1 s count and the mean
	// per second from the recovery until the last agent holds the new
	// policy (or the end of the run if some never do).
	RecoveryPeak int
	RecoveryMean float64
	T50, T99     time.Duration
	T100         time.Duration
	Stale        int // agents without the new policy at the end
	// LateRate is requests per agent per minute in the last 5 minutes of an
	// outage of 10 minutes or more (the flat cadence); -1 otherwise.
	LateRate float64
	// Timeline is the server's requests in each second of the run.
	Timeline []int
}

// PeakMean is RecoveryPeak / RecoveryMean (0 without requests).
func (r Result) PeakMean() float64 {
	if r.RecoveryMean == 0 {
		return 0
	}
	return float64(r.RecoveryPeak) / r.RecoveryMean
}

const (
	oldHash = "1111111111111111111111111111111111111111"
	newHash = "2222222222222222222222222222222222222222"
)

// bundle is a tiny full bundle: the simulator measures retries, not stores.
func bundle(hash string) []byte {
	b, _ := json.Marshal(fetcher.PolicyBundle{
		Manifest:      []string{"p.rego"},
		Hash:          hash,
		DataModules:   []fetcher.DataModule{},
		PolicyModules: []fetcher.PolicyModule{{Path: "p.rego", PackageName: "p", Rego: "package p\n"}},
	})
	return b
}

// server is the simulated OPAL server: it answers by phase and counts
// requests per second.
type server struct {
	sc      Scenario
	clk     clock.Clock
	start   time.Time
	buckets []atomic.Int64
	body    []byte // the new bundle
	errBody []byte
}

func newServer(sc Scenario, clk clock.Clock) *server {
	n := int(sc.End()/time.Second) + 1
	return &server{sc: sc, clk: clk, start: clk.Now(), buckets: make([]atomic.Int64, n),
		body: bundle(newHash), errBody: []byte(`{"detail":"policy not ready"}`)}
}

// serve counts one request and returns the answer due now.
func (s *server) serve() (status int, retryAfter string, body []byte) {
	at := s.clk.Since(s.start)
	i := min(max(int(at/time.Second), 0), len(s.buckets)-1)
	s.buckets[i].Add(1)
	for _, p := range s.sc.Phases {
		if at < p.Until {
			return p.Status, p.RetryAfter, s.errBody
		}
	}
	return http.StatusOK, "", s.body
}

// RoundTrip answers in memory, so a request never blocks (and blocks
// durably inside a synctest bubble, as it must).
func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	status, ra, body := s.serve()
	h := http.Header{"Content-Type": {"application/json"}}
	if ra != "" {
		h.Set("Retry-After", ra)
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// ok reports whether an answer carries the new policy.
func ok(status int) bool { return status == http.StatusOK }

// recorder keeps when each agent first held the new policy.
type recorder struct {
	start time.Time
	clk   clock.Clock
	at    []atomic.Int64 // time since start + 1ns; 0 = not yet
}

func (r *recorder) recovered(i int) {
	r.at[i].CompareAndSwap(0, int64(r.clk.Since(r.start))+1)
}

// agent is one simulated client of any policy.
type agent interface {
	// notify delivers a policy notification (changed dirs ["."]).
	notify()
	// stop ends the agent and waits for its goroutines.
	stop()
}

// Run simulates one scenario with every agent on policy p and returns its
// figures. Call it inside a testing/synctest bubble (see the package doc).
func Run(sc Scenario, p Policy, cfg Config) Result {
	n := cfg.Agents
	if n <= 0 {
		n = 10000
	}
	clk := clock.New()
	srv := newServer(sc, clk)
	rec := &recorder{start: srv.start, clk: clk, at: make([]atomic.Int64, n)}
	ctx, cancel := context.WithCancel(context.Background())
	agents := make([]agent, n)
	for i := range agents {
		// One stream per agent and purpose, the same for every policy, so
		// the policies see the same reconnect storm.
		connect := pubsub.Backoff(1, rand.New(rand.NewPCG(cfg.Seed, uint64(i)<<1)).Float64())
		rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(i)<<1|1)).Float64
		switch p {
		case Ours, OursNoJitter, OursOneAttempt, OursMaxRetryAfter120:
			agents[i] = startOurs(ctx, i, p, connect, rnd, clk, srv, rec)
		case PythonOPAL:
			agents[i] = startPython(ctx, i, connect, rnd, clk, srv, rec)
		case OPABundle:
			agents[i] = startOPA(ctx, i, rnd, clk, srv, rec)
		}
	}
	if sc.Notify {
		clk.Sleep(sc.Recovery())
		for _, a := range agents {
			a.notify()
		}
		clk.Sleep(sc.Tail)
	} else {
		clk.Sleep(sc.End())
	}
	cancel()
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(a.stop)
	}
	wg.Wait()
	return summarize(sc, p, n, srv, rec)
}

// ours is an agent running the project's fetcher, scheduler and updater.
type ours struct {
	u     *updater.Updater
	sched *scheduler.Scheduler
	conn  *clock.Timer
	done  chan struct{}
}

func startOurs(ctx context.Context, i int, p Policy, connect time.Duration, rnd func() float64,
	clk clock.Clock, srv *server, rec *recorder) *ours {
	store := memstore.New()
	// The agent held the old policy before the outage.
	old, _ := fetcher.DecodeBundle(bundle(oldHash))
	_ = store.ApplyPolicy(ctx, old)

	// Defaults of the OPAL_POLICY_UPDATER_* variables (docs/configuration.md).
	maxRetryAfter := 60 * time.Second
	if p == OursMaxRetryAfter120 {
		maxRetryAfter = 120 * time.Second // caps the hint (F4), bounds the fetch (F7), ceilings D2/D3
	}
	retry := config.DefaultPolicyUpdaterConnRetry()
	if p == OursOneAttempt {
		retry.Attempts = 1
	}
	f := fetcher.New(fetcher.Options{
		ServerURL:     "http://opal-server:7002",
		Retry:         retry,
		MaxRetryAfter: maxRetryAfter,
		HTTPClient:    &http.Client{Transport: srv},
		Clock:         clk,
		Rand:          rnd,
		NoHintJitter:  p == OursNoJitter,
	})
	a := &ours{done: make(chan struct{})}
	so := scheduler.Options{Enabled: true, MaxRetryAfter: maxRetryAfter, MaxRounds: 20, Clock: clk, Rand: rnd,
		Fire: func() { a.u.Deferred() }}
	if p == OursNoJitter {
		so.Jitter = func(d time.Duration) time.Duration { return d }
	}
	a.sched = scheduler.New(so)
	a.u = updater.New(updater.Options{Store: store, Fetcher: f, Scheduler: a.sched, Clock: clk,
		OnTransaction: func(tx updater.Transaction) {
			if tx.Success && tx.ID == newHash {
				rec.recovered(i)
			}
		}})
	go func() {
		defer close(a.done)
		_ = a.u.Run(ctx)
	}()
	// The outage begins with a reconnect storm: each agent's WebSocket
	// reconnects after the pub/sub client's first jittered backoff.
	a.conn = clk.AfterFunc(connect, a.u.Connect)
	return a
}

func (a *ours) notify() { a.u.PolicyUpdate([]string{"."}) }

func (a *ours) stop() {
	a.conn.Stop()
	a.sched.Stop()
	a.u.Stop()
	<-a.done
}

// summarize turns the server's counts and the recovery times into a Result.
func summarize(sc Scenario, p Policy, n int, srv *server, rec *recorder) Result {
	r := Result{Scenario: sc.Name, Policy: p, Agents: n, T50: -1, T99: -1, T100: -1, LateRate: -1}
	r.Timeline = make([]int, len(srv.buckets))
	for i := range srv.buckets {
		r.Timeline[i] = int(srv.buckets[i].Load())
		r.PeakRPS = max(r.PeakRPS, r.Timeline[i])
	}
	recSec := int(sc.Recovery() / time.Second)
	outage := 0
	for _, c := range r.Timeline[:recSec] {
		outage += c
	}
	r.OutageRequests = float64(outage) / float64(n)

	// Recovery times, sorted, from the recovery.
	var times []time.Duration
	for i := range rec.at {
		if v := rec.at[i].Load(); v != 0 {
			times = append(times, time.Duration(v-1)-sc.Recovery())
		}
	}
	slices.Sort(times)
	r.Stale = n - len(times)
	nth := func(frac float64) time.Duration {
		k := int(frac*float64(n)+0.999999) - 1 // ceil(frac*n)-th agent
		if k < len(times) {
			return times[max(k, 0)]
		}
		return -1
	}
	r.T50, r.T99, r.T100 = nth(0.5), nth(0.99), nth(1)

	// The recovery window: until the last agent holds the policy, or the end.
	endSec := len(r.Timeline)
	if r.T100 >= 0 {
		endSec = min(recSec+int(r.T100/time.Second)+1, len(r.Timeline))
	}
	total := 0
	for _, c := range r.Timeline[recSec:endSec] {
		total += c
		r.RecoveryPeak = max(r.RecoveryPeak, c)
	}
	r.RecoveryMean = float64(total) / float64(max(endSec-recSec, 1))

	if sc.Recovery() >= 10*time.Minute {
		late := 0
		for _, c := range r.Timeline[recSec-300 : recSec] {
			late += c
		}
		r.LateRate = float64(late) / float64(n) / 5
	}
	return r
}
