// Package fleetsim simulates a fleet of agents against one OPAL server
// during an event (an outage, a restart, a notification burst): N agents,
// one in-memory server whose answers follow a scenario's phases, and a
// virtual clock. Our agents run the project's real code, unchanged: fetcher
// (classification F1, waits F4, bound F7) behind an in-memory
// http.RoundTripper, scheduler (D1-D8), the serial update queue (updater,
// with its burst interval) writing an internal/memstore store, the pub/sub
// reconnect schedule (pubsub.Reconnect) and the connect resync spread
// (internal/resync). The peers' published behaviour (the Python OPAL client
// on master and OPA's bundle downloader) runs beside it, modelled from their
// source.
//
// The server is honest: it may have a capacity of C policy answers per
// second (beyond it a 503 without Retry-After, or, in the queueing variant,
// a late answer); it counts WebSocket handshakes and data requests
// (/data/config and one source per connect) beside /policy, and the bytes
// of each answer; its sockets drop when it goes down or restarts, and it
// refuses handshakes while down.
//
// Run needs virtual time: call it inside a testing/synctest bubble, where
// clock.New() and every timer are virtual.
package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/opal-go/opal-client/internal/resync"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// Policy is a retry policy simulated for every agent of one run.
type Policy int

// The simulated policies, in table order.
const (
	Ours         Policy = iota // this project at its defaults
	OursNoJitter               // the same with every jitter and spread off
	PythonOPAL                 // the Python client on master (protocol §8)
	OPABundle                  // OPA's bundle downloader, polling
	// OursOneAttempt is ours with OPAL_POLICY_UPDATER_CONN_RETRY attempts=1
	// (a configuration): every fetch defers through the scheduler.
	OursOneAttempt
	// OursMaxRetryAfter120 is ours with OPAL_POLICY_UPDATER_MAX_RETRY_AFTER
	// 120 (a configuration): the operator's lever on D3's flat cadence.
	OursMaxRetryAfter120
)

// Policies lists every Policy, in table order.
var Policies = []Policy{Ours, OursNoJitter, OursOneAttempt, OursMaxRetryAfter120, PythonOPAL, OPABundle}

// CorePolicies are the rows run at a limited capacity: ours, ours without
// jitter (the control of T4) and the two peers.
var CorePolicies = []Policy{Ours, OursNoJitter, PythonOPAL, OPABundle}

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

// Phase is one stretch of the event: until Until (from the start) the
// server answers every policy request with Status and, when set, the
// Retry-After header RetryAfter. Down means the server is unreachable:
// connections are refused (handshakes and requests alike).
type Phase struct {
	Until      time.Duration
	Status     int
	RetryAfter string
	Down       bool
}

// Scenario is one event. The server's policy hash changes at the start;
// it serves the new policy only after the last phase (the recovery).
type Scenario struct {
	Name   string // short id: a, b, ...
	Title  string
	Phases []Phase
	// Tail is how long the simulation runs after the recovery.
	Tail time.Duration
	// Notify publishes a policy notification at the recovery.
	Notify bool
	// Drop drops every socket at the start (a restart or a crash).
	Drop bool
	// Burst publishes this many notifications, evenly over BurstOver from
	// the start, each with a new policy hash (the last one is the new
	// policy every agent must end with).
	Burst     int
	BurstOver time.Duration
	// HintRetryAfter is the Retry-After of the phases, 0 if none.
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

// Scenarios are the events. Each outage begins with the server's restart
// (every socket drops; the new instance accepts handshakes at once unless
// Down): the outages (a) to (e) and (d+), the clone as
// the real server answers it (a0), a restart (r), a long unreachable server
// (s), and a notification burst (n).
func Scenarios() []Scenario {
	const tail = 10 * time.Minute
	return []Scenario{
		{Name: "a", Title: "clone: 503 Retry-After 30 for 45 s, then serves",
			Phases: []Phase{{Until: 45 * time.Second, Status: http.StatusServiceUnavailable, RetryAfter: "30"}}, Tail: tail, HintRetryAfter: 30 * time.Second, Drop: true},
		{Name: "a0", Title: "clone as the real server answers it: 503 without Retry-After for 45 s",
			Phases: []Phase{{Until: 45 * time.Second, Status: http.StatusServiceUnavailable}}, Tail: tail, Drop: true},
		{Name: "b", Title: "503 Retry-After 5 for 20 min",
			Phases: []Phase{{Until: 20 * time.Minute, Status: http.StatusServiceUnavailable, RetryAfter: "5"}}, Tail: tail, HintRetryAfter: 5 * time.Second, Drop: true},
		{Name: "c", Title: "503 without Retry-After for 20 min",
			Phases: []Phase{{Until: 20 * time.Minute, Status: http.StatusServiceUnavailable}}, Tail: tail, Drop: true},
		{Name: "d", Title: "409 for 5 min, then ready (no notification)",
			Phases: []Phase{{Until: 5 * time.Minute, Status: http.StatusConflict}}, Tail: tail, Drop: true},
		{Name: "d+", Title: "409 for 5 min, then ready with a policy notification",
			Phases: []Phase{{Until: 5 * time.Minute, Status: http.StatusConflict}}, Tail: tail, Notify: true, Drop: true},
		{Name: "e", Title: "503 without Retry-After for 5 min, then Retry-After 99999 for 10 min",
			Phases: []Phase{
				{Until: 5 * time.Minute, Status: http.StatusServiceUnavailable},
				{Until: 15 * time.Minute, Status: http.StatusServiceUnavailable, RetryAfter: "99999"},
			}, Tail: tail, Drop: true},
		{Name: "r", Title: "restart: every socket drops, healthy at once with a changed policy",
			Tail: 3 * time.Minute, Drop: true},
		{Name: "s", Title: "unreachable for 20 min (sockets drop), back with a changed policy",
			Phases: []Phase{{Until: 20 * time.Minute, Down: true}}, Tail: 5 * time.Minute, Drop: true},
		{Name: "n", Title: "burst: 1,000 notifications in 1 s, each a new policy",
			Tail: 2 * time.Minute, Burst: 1000, BurstOver: time.Second},
	}
}

// RunSpec is one row of a scenario's table.
type RunSpec struct {
	Policy   Policy
	Capacity int
	Queue    bool
}

// RunsOf lists the rows simulated for sc: every policy against an
// unlimited server, the core policies at TargetCapacity (with
// MAX_RETRY_AFTER=120 too in a long 503 outage), and, for the restart, the
// core policies against a server that queues instead.
func RunsOf(sc Scenario) []RunSpec {
	var out []RunSpec
	for _, p := range CorePolicies {
		out = append(out, RunSpec{Policy: p, Capacity: TargetCapacity})
	}
	if sc.Recovery() >= 10*time.Minute && sc.Phases[0].Status == http.StatusServiceUnavailable {
		// In a long outage the flat cadence decides the recovery: the
		// operator's lever on it, against the capped server too.
		out = append(out, RunSpec{Policy: OursMaxRetryAfter120, Capacity: TargetCapacity})
	}
	if sc.Name == "r" {
		for _, p := range CorePolicies {
			out = append(out, RunSpec{Policy: p, Capacity: TargetCapacity, Queue: true})
		}
	}
	policies := Policies
	if sc.Burst > 0 || sc.Name == "r" || sc.Name == "s" {
		policies = CorePolicies // the configuration rows are about outages' cadence
	}
	for _, p := range policies {
		out = append(out, RunSpec{Policy: p})
	}
	return out
}

// Config sizes a run.
type Config struct {
	Agents int    // 0 means 10,000
	Seed   uint64 // seeds every agent's random source
	// Capacity is the server's policy answers per second; 0 is unlimited.
	// Handshakes and data requests are counted, not limited: building a
	// bundle is the server's costly work.
	Capacity int
	// Queue makes a server over capacity answer late (at its next free
	// slot) instead of with a 503 without Retry-After.
	Queue bool
	// ResyncSpread, when > 0, replaces OPAL_RESYNC_SPREAD's default for our
	// agents (a sensitivity run; the tables use the default).
	ResyncSpread time.Duration
}

// defaults is the agent's configuration with no OPAL_ variable set: the
// simulated agents run at the settings table's defaults, so a changed
// default shows in the next run.
var defaults = sync.OnceValue(func() *config.Config {
	c, err := config.LoadFrom(func(string) (string, bool) { return "", false })
	if err != nil {
		panic("fleetsim: the default configuration does not load: " + err.Error())
	}
	return c
})

// Request kinds, counted apart.
const (
	kindPolicy = iota
	kindHandshake
	kindData
	nKinds
)

// Result holds one policy's figures for one scenario. Durations are on the
// virtual clock; times "to N%" run from the recovery and are -1 when never
// reached.
type Result struct {
	Scenario string
	Policy   Policy
	Agents   int
	Capacity int
	Queue    bool
	// OutageRequests is the policy requests per agent before the recovery;
	// OutageHandshakes the handshake attempts per agent.
	OutageRequests, OutageHandshakes float64
	// PeakRPS is the largest count of requests of every kind offered in a
	// 1 s window of the run; PeakPolicy of policy requests alone.
	PeakRPS, PeakPolicy int
	// RecoveryPeak and RecoveryMean are the largest 1 s count and the mean
	// per second of every kind, from the recovery until the last agent
	// holds the new policy (or the end).
	RecoveryPeak int
	RecoveryMean float64
	T50, T99     time.Duration
	T100         time.Duration
	Stale        int // agents without the new policy at the end
	// LateRate is policy requests per agent per minute in the last 5
	// minutes of an outage of 10 minutes or more; -1 otherwise.
	LateRate float64
	// PerKind is the requests of each kind in the whole run, per agent.
	Handshakes, Data, PolicyReqs float64
	// Refused is the policy requests answered 503 over capacity, per agent.
	Refused float64
	// BytesPerAgent is the bytes of every answer, per agent.
	BytesPerAgent float64
	// MaxAgentFetchesPerSec is the most policy fetches (updates, their
	// retries included) one agent started in one aligned second;
	// MaxAgentRequestsPerSec the most policy requests it sent.
	MaxAgentFetchesPerSec, MaxAgentRequestsPerSec int
	// Timeline is the server's requests of every kind in each second.
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

// burstHash is the hash of the k-th policy of a burst (k >= 1).
func burstHash(k int) string { return fmt.Sprintf("%040d", k) }

// bundle is a tiny full bundle: the simulator measures requests, not stores.
func bundle(hash string) []byte {
	b, _ := json.Marshal(fetcher.PolicyBundle{
		Manifest:      []string{"p.rego"},
		Hash:          hash,
		DataModules:   []fetcher.DataModule{},
		PolicyModules: []fetcher.PolicyModule{{Path: "p.rego", PackageName: "p", Rego: "package p\n"}},
	})
	return b
}

// dataConfigBytes and dataSourceBytes size the data answers of a connect.
const (
	dataConfigBytes = 300
	dataSourceBytes = 2000
	handshakeBytes  = 200
)

var errDown = errors.New("connection refused")

// server is the simulated OPAL server: it answers by phase and capacity and
// counts requests per second and kind.
type server struct {
	sc    Scenario
	cfg   Config
	clk   clock.Clock
	start time.Time
	// buckets[kind][second]
	buckets [nKinds][]atomic.Int64
	bytes   atomic.Int64
	refused atomic.Int64
	errBody []byte

	mu       sync.Mutex
	current  []byte // the bundle served now, by phase or burst
	hash     string
	dropped  chan struct{} // closed and replaced when every socket drops
	capSec   int           // the second capCount counts
	capCount int
	nextFree time.Time // queueing variant: the next free answer slot
}

func newServer(sc Scenario, cfg Config, clk clock.Clock) *server {
	n := int(sc.End()/time.Second) + 1
	s := &server{sc: sc, cfg: cfg, clk: clk, start: clk.Now(), errBody: []byte(`{"detail":"policy not ready"}`),
		dropped: make(chan struct{}), capSec: -1}
	for k := range s.buckets {
		s.buckets[k] = make([]atomic.Int64, n)
	}
	s.setPolicy(newHash)
	return s
}

func (s *server) setPolicy(hash string) {
	b := bundle(hash)
	s.mu.Lock()
	s.current, s.hash = b, hash
	s.mu.Unlock()
}

func (s *server) count(kind int) int {
	at := s.clk.Since(s.start)
	i := min(max(int(at/time.Second), 0), len(s.buckets[kind])-1)
	s.buckets[kind][i].Add(1)
	return i
}

// phase is the phase now, nil after the recovery.
func (s *server) phase() *Phase {
	at := s.clk.Since(s.start)
	for i := range s.sc.Phases {
		if at < s.sc.Phases[i].Until {
			return &s.sc.Phases[i]
		}
	}
	return nil
}

// admit applies the capacity to one policy answer: 0 to answer now, a
// positive delay to answer late (queueing), or -1 for a 503.
func (s *server) admit(sec int) time.Duration {
	if s.cfg.Capacity <= 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Queue {
		now := s.clk.Now()
		slot := s.nextFree
		if slot.Before(now) {
			slot = now
		}
		s.nextFree = slot.Add(time.Second / time.Duration(s.cfg.Capacity))
		return slot.Sub(now)
	}
	if sec != s.capSec {
		s.capSec, s.capCount = sec, 0
	}
	if s.capCount >= s.cfg.Capacity {
		return -1
	}
	s.capCount++
	return 0
}

// servePolicy counts one policy request and returns the answer due now,
// after waiting on the clock in the queueing variant (ctx ends the wait).
func (s *server) servePolicy(ctx context.Context) (status int, retryAfter string, body []byte, err error) {
	sec := s.count(kindPolicy)
	if p := s.phase(); p != nil {
		if p.Down {
			return 0, "", nil, errDown
		}
		s.bytes.Add(int64(len(s.errBody)))
		return p.Status, p.RetryAfter, s.errBody, nil
	}
	switch d := s.admit(sec); {
	case d < 0:
		s.refused.Add(1)
		s.bytes.Add(int64(len(s.errBody)))
		return http.StatusServiceUnavailable, "", s.errBody, nil
	case d > 0:
		t := s.clk.Timer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, "", nil, ctx.Err()
		}
	}
	s.mu.Lock()
	body = s.current
	s.mu.Unlock()
	s.bytes.Add(int64(len(body)))
	return http.StatusOK, "", body, nil
}

// handshake counts one WebSocket handshake; an error if the server is down.
func (s *server) handshake() error {
	s.count(kindHandshake)
	if p := s.phase(); p != nil && p.Down {
		return errDown
	}
	s.bytes.Add(handshakeBytes)
	return nil
}

// connectData counts a connect's data requests: /data/config and its one
// source.
func (s *server) connectData() {
	if p := s.phase(); p != nil && p.Down { // counted, nothing answered
		s.count(kindData)
		s.count(kindData)
		return
	}
	s.count(kindData)
	s.count(kindData)
	s.bytes.Add(dataConfigBytes + dataSourceBytes)
}

// drops returns the channel closed at the next drop of every socket.
func (s *server) drops() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *server) dropAll() {
	s.mu.Lock()
	close(s.dropped)
	s.dropped = make(chan struct{})
	s.mu.Unlock()
}

// transport is one agent's in-memory client to the server: it records the
// agent's policy requests per second.
type transport struct {
	srv *server
	per *agentStats
}

// RoundTrip answers in memory (a queued answer waits on the clock, which
// blocks durably inside a synctest bubble, as it must).
func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.per.policy(t.srv)
	status, ra, body, err := t.srv.servePolicy(req.Context())
	if err != nil {
		return nil, err
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if ra != "" {
		h.Set("Retry-After", ra)
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// agentStats counts one agent's policy requests and policy fetches (a
// fetch is one update, its retries included) per aligned second.
type agentStats struct {
	mu   sync.Mutex
	req  perSec
	fetc perSec
}

type perSec struct{ sec, n, max int }

func (p *perSec) add(sec int) {
	if sec != p.sec {
		p.sec, p.n = sec, 0
	}
	p.n++
	p.max = max(p.max, p.n)
}

func (a *agentStats) policy(srv *server) {
	sec := int(srv.clk.Since(srv.start) / time.Second)
	a.mu.Lock()
	a.req.add(sec)
	a.mu.Unlock()
}

func (a *agentStats) fetch(srv *server) {
	sec := int(srv.clk.Since(srv.start) / time.Second)
	a.mu.Lock()
	a.fetc.add(sec)
	a.mu.Unlock()
}

// countingFetcher counts each whole fetch of our updater.
type countingFetcher struct {
	f   *fetcher.Fetcher
	srv *server
	per *agentStats
}

func (c countingFetcher) Fetch(ctx context.Context, r fetcher.Request) (*fetcher.Result, error) {
	c.per.fetch(c.srv)
	return c.f.Fetch(ctx, r)
}

// recorder keeps when each agent first held the new policy.
type recorder struct {
	start time.Time
	clk   clock.Clock
	want  string
	at    []atomic.Int64 // time since start + 1ns; 0 = not yet
}

func (r *recorder) applied(i int, hash string) {
	if hash == r.want {
		r.at[i].CompareAndSwap(0, int64(r.clk.Since(r.start))+1)
	}
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
	srv := newServer(sc, cfg, clk)
	want := newHash
	if sc.Burst > 0 {
		want = burstHash(sc.Burst)
		srv.setPolicy(oldHash)
	}
	rec := &recorder{start: srv.start, clk: clk, want: want, at: make([]atomic.Int64, n)}
	stats := make([]agentStats, n)
	ctx, cancel := context.WithCancel(context.Background())
	agents := make([]agent, n)
	for i := range agents {
		// One stream per agent, the same for every policy.
		rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(i))).Float64
		env := &env{i: i, ctx: ctx, clk: clk, srv: srv, rec: rec, rnd: rnd, stats: &stats[i], resyncSpread: cfg.ResyncSpread}
		switch p {
		case Ours, OursNoJitter, OursOneAttempt, OursMaxRetryAfter120:
			agents[i] = startOurs(env, p)
		case PythonOPAL:
			agents[i] = startPython(env)
		case OPABundle:
			agents[i] = startOPA(env)
		}
	}
	if sc.Drop {
		srv.dropAll()
	}
	if sc.Burst > 0 {
		step := sc.BurstOver / time.Duration(sc.Burst)
		for k := 1; k <= sc.Burst; k++ {
			srv.setPolicy(burstHash(k))
			for _, a := range agents {
				a.notify()
			}
			clk.Sleep(step)
		}
		clk.Sleep(sc.End() - sc.BurstOver)
	} else if sc.Notify {
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
	r := summarize(sc, p, n, srv, rec)
	r.Capacity, r.Queue = cfg.Capacity, cfg.Queue
	for i := range stats {
		r.MaxAgentFetchesPerSec = max(r.MaxAgentFetchesPerSec, stats[i].fetc.max)
		r.MaxAgentRequestsPerSec = max(r.MaxAgentRequestsPerSec, stats[i].req.max)
	}
	return r
}

// env is what every agent model gets.
type env struct {
	i     int
	ctx   context.Context
	clk   clock.Clock
	srv   *server
	rec   *recorder
	rnd   func() float64
	stats *agentStats
	// resyncSpread overrides OPAL_RESYNC_SPREAD's default when > 0.
	resyncSpread time.Duration
}

// ours is an agent running the project's fetcher, scheduler, updater,
// reconnect schedule and resync spread.
type ours struct {
	u      *updater.Updater
	sched  *scheduler.Scheduler
	spread *resync.Spreader
	done   chan struct{}
	sock   chan struct{}
}

func startOurs(e *env, p Policy) *ours {
	store := memstore.New()
	// The agent held the old policy before the event.
	old, _ := fetcher.DecodeBundle(bundle(oldHash))
	_ = store.ApplyPolicy(e.ctx, old)

	// The defaults of the OPAL_ variables, from the settings table, with
	// the row's configuration on top.
	c := *defaults()
	switch p {
	case OursMaxRetryAfter120:
		c.PolicyUpdaterMaxRetryAfter = 120 * time.Second
	case OursOneAttempt:
		c.PolicyUpdaterConnRetry.Attempts = 1
	}
	if e.resyncSpread > 0 {
		c.ResyncSpread = e.resyncSpread
	}
	maxRetryAfter := c.PolicyUpdaterMaxRetryAfter
	noJitter := p == OursNoJitter
	rnd := e.rnd
	if noJitter {
		rnd = func() float64 { return 1 } // every spread at its top: no spread
	}
	fo := fetcher.PolicyOptions(&c) // the agent's own mapping of its settings
	fo.ServerURL = "http://opal-server:7002"
	fo.HTTPClient = &http.Client{Transport: transport{srv: e.srv, per: e.stats}}
	fo.Clock, fo.Rand, fo.NoHintJitter = e.clk, e.rnd, noJitter
	f := fetcher.New(fo)
	a := &ours{done: make(chan struct{}), sock: make(chan struct{})}
	so := scheduler.Options{Enabled: true, MaxRetryAfter: maxRetryAfter, MaxRounds: c.PolicyUpdaterMaxDeferredRounds, Clock: e.clk, Rand: e.rnd,
		Fire: func() { a.u.Deferred() }}
	if noJitter {
		so.Jitter = func(d time.Duration) time.Duration { return d }
	}
	a.sched = scheduler.New(so)
	a.u = updater.New(updater.Options{Store: store, Fetcher: countingFetcher{f, e.srv, e.stats}, Scheduler: a.sched, Clock: e.clk,
		MinInterval: c.PolicyUpdaterMinFetchInterval,
		OnTransaction: func(tx updater.Transaction) {
			if tx.Success {
				e.rec.applied(e.i, tx.ID)
			}
		}})
	a.spread = resync.New(resync.Options{After: c.PubSubReconnectSpread, Window: c.ResyncSpread,
		Clock: e.clk, Rand: rnd, Resync: func() {
			a.u.Connect()
			e.srv.connectData()
		}})
	go func() {
		defer close(a.done)
		_ = a.u.Run(e.ctx)
	}()
	rc := pubsub.NewReconnect(pubsub.Options{ReconnectSpread: c.PubSubReconnectSpread, ReconnectMaxWait: c.PubSubReconnectMaxWait,
		MaxRetryAfter: maxRetryAfter, Rand: rnd})
	go a.socket(e, rc, e.srv.drops()) // connected before the event
	return a
}

// socket models the pub/sub connection with the real reconnect schedule:
// connected until the server drops every socket, then reconnecting.
func (a *ours) socket(e *env, rc *pubsub.Reconnect, drops <-chan struct{}) {
	defer close(a.sock)
	since := e.clk.Now().Add(-time.Hour)
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-drops:
		}
		d := rc.Next(e.clk.Since(since), errors.New("dropped"))
		a.spread.Lost(e.clk.Now())
		for {
			if !sleep(e.ctx, e.clk, d) {
				return
			}
			drops = e.srv.drops()
			if err := e.srv.handshake(); err != nil {
				d = rc.Next(0, err)
				continue
			}
			since = e.clk.Now()
			a.spread.Connected(true) // every agent holds a policy
			break
		}
	}
}

func (a *ours) notify() { a.u.PolicyUpdate([]string{"."}) }

func (a *ours) stop() {
	<-a.sock
	a.spread.Stop()
	a.sched.Stop()
	a.u.Stop()
	<-a.done
}

// summarize turns the server's counts and the recovery times into a Result.
func summarize(sc Scenario, p Policy, n int, srv *server, rec *recorder) Result {
	r := Result{Scenario: sc.Name, Policy: p, Agents: n, T50: -1, T99: -1, T100: -1, LateRate: -1}
	secs := len(srv.buckets[kindPolicy])
	r.Timeline = make([]int, secs)
	var kinds [nKinds]int
	for s := 0; s < secs; s++ {
		for k := range srv.buckets {
			c := int(srv.buckets[k][s].Load())
			r.Timeline[s] += c
			kinds[k] += c
		}
		r.PeakRPS = max(r.PeakRPS, r.Timeline[s])
		r.PeakPolicy = max(r.PeakPolicy, int(srv.buckets[kindPolicy][s].Load()))
	}
	fn := float64(n)
	r.PolicyReqs, r.Handshakes, r.Data = float64(kinds[kindPolicy])/fn, float64(kinds[kindHandshake])/fn, float64(kinds[kindData])/fn
	r.Refused = float64(srv.refused.Load()) / fn
	r.BytesPerAgent = float64(srv.bytes.Load()) / fn
	recSec := int(sc.Recovery() / time.Second)
	outage, hs := 0, 0
	for s := 0; s < recSec; s++ {
		outage += int(srv.buckets[kindPolicy][s].Load())
		hs += int(srv.buckets[kindHandshake][s].Load())
	}
	r.OutageRequests, r.OutageHandshakes = float64(outage)/fn, float64(hs)/fn

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
		for s := recSec - 300; s < recSec; s++ {
			late += int(srv.buckets[kindPolicy][s].Load())
		}
		r.LateRate = float64(late) / fn / 5
	}
	return r
}
