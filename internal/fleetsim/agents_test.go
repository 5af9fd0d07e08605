package fleetsim

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/internal/pubsub"
	"github.com/opal-go/opal-client/internal/resync"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// pipeListener serves a devserver over in-memory pipes, so real clients
// (HTTP and WebSocket) run inside a synctest bubble on virtual time.
type pipeListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.ch <- s:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// liveAgent is the agent's policy path as internal/agent wires it, at the
// defaults of the OPAL_ variables: pub/sub client (reconnect schedule),
// resync spread, serial queue with its burst interval, fetcher, scheduler.
type liveAgent struct {
	ps     *pubsub.Client
	u      *updater.Updater
	sched  *scheduler.Scheduler
	spread *resync.Spreader
	store  *memstore.Store
}

func startLive(t *testing.T, ctx context.Context, wg *sync.WaitGroup, ln *pipeListener, cfg *config.Config, seed uint64) *liveAgent {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rnd := rand.New(rand.NewPCG(seed, 99)).Float64
	a := &liveAgent{store: memstore.New()}
	fo := fetcher.PolicyOptions(cfg)
	fo.ServerURL = "http://opal"
	fo.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: ln.dial}}
	fo.Rand, fo.Logger = rnd, quiet
	f := fetcher.New(fo)
	a.sched = scheduler.New(scheduler.Options{Enabled: cfg.PolicyUpdaterRescheduleOnRetryable, MaxRetryAfter: cfg.PolicyUpdaterMaxRetryAfter,
		MaxRounds: cfg.PolicyUpdaterMaxDeferredRounds, Rand: rnd, Logger: quiet, Fire: func() { a.u.Deferred() }})
	a.u = updater.New(updater.Options{Store: a.store, Fetcher: f, Scheduler: a.sched, Logger: quiet,
		MinInterval: cfg.PolicyUpdaterMinFetchInterval})
	a.spread = resync.New(resync.Options{After: cfg.PubSubReconnectSpread, Window: cfg.ResyncSpread, Rand: rnd, Resync: a.u.Connect})
	a.ps = pubsub.New(pubsub.Options{
		URL: "ws://opal/ws", Topics: cfg.PolicyTopics(),
		OnConnect: func() {
			h, _ := a.store.PolicyHash(ctx)
			a.spread.Connected(h != "")
		},
		OnState: func(up bool) {
			if !up {
				a.spread.Lost(time.Now()) // virtual time in the bubble
			}
		},
		ReconnectSpread: cfg.PubSubReconnectSpread, ReconnectMaxWait: cfg.PubSubReconnectMaxWait,
		MaxRetryAfter: cfg.PolicyUpdaterMaxRetryAfter, Rand: rnd, Logger: quiet,
		Dialer: &websocket.Dialer{NetDialContext: ln.dial},
	})
	wg.Go(func() { _ = a.u.Run(ctx) })
	wg.Go(func() { _ = a.ps.Run(ctx) })
	return a
}

func (a *liveAgent) stop() {
	a.spread.Stop()
	a.sched.Stop()
	a.u.Stop()
}

// defaultConfig is the configuration of an empty environment.
func defaultConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.LoadFrom(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// perSecondMax is the most times falling in one second from t0.
func perSecondMax(times []time.Time, t0 time.Time) int {
	count := map[int]int{}
	most := 0
	for _, at := range times {
		s := int(at.Sub(t0) / time.Second)
		count[s]++
		most = max(most, count[s])
	}
	return most
}

// A server restart that drops every socket: 40 agents running the real
// client code at defaults reconnect and resync spread out, with no second
// holding more than a fifth of the reconnects or a tenth of the resync
// fetches, and every one resynced within the documented bound
// (OPAL_PUBSUB_RECONNECT_SPREAD + OPAL_RESYNC_SPREAD = 70 s). Virtual time:
// the 70 s take milliseconds.
func TestRestart_40AgentsResyncSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		cfg := defaultConfig(t)
		srv := devserver.New(devserver.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		ln := newPipeListener()
		hs := &http.Server{Handler: srv}
		go func() { _ = hs.Serve(ln) }()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		agents := make([]*liveAgent, n)
		for i := range agents {
			agents[i] = startLive(t, ctx, &wg, ln, cfg, uint64(i+1))
		}
		time.Sleep(30 * time.Second) // start-up: every agent fetches at once
		for i, a := range agents {
			if h, _ := a.store.PolicyHash(ctx); h == "" {
				t.Fatalf("agent %d holds no policy after start-up", i)
			}
		}
		dropped := time.Now()
		srv.DropAllSockets() // the restart: healthy at once
		time.Sleep(2 * time.Minute)

		var reconnects, resyncs []time.Time
		for _, r := range srv.Requests() {
			if r.Time.Before(dropped) {
				continue
			}
			switch {
			case r.Path == "/ws" && r.Status == http.StatusSwitchingProtocols:
				reconnects = append(reconnects, r.Time)
			case r.Path == "/policy":
				resyncs = append(resyncs, r.Time)
			}
		}
		if len(reconnects) != n || len(resyncs) != n {
			t.Fatalf("%d reconnects and %d resync fetches after the drop, want %d of each", len(reconnects), len(resyncs), n)
		}
		// Mutations: the reconnect spread or the resync spread dropped.
		if m := perSecondMax(reconnects, dropped); m > n/5 {
			t.Errorf("%d of %d reconnects in one second, want at most %d", m, n, n/5)
		}
		if m := perSecondMax(resyncs, dropped); m > n/10 {
			t.Errorf("%d of %d resync fetches in one second, want at most %d", m, n, n/10)
		}
		bound := cfg.PubSubReconnectSpread + cfg.ResyncSpread
		if last := slices.MaxFunc(resyncs, time.Time.Compare); last.Sub(dropped) > bound {
			t.Errorf("last resync %v after the drop, want within %v", last.Sub(dropped), bound)
		}
		for _, a := range agents {
			a.stop()
		}
		cancel()
		wg.Wait()
		_ = hs.Close()
		srv.Close()
	})
}

// 503 with Retry-After: 8 and one attempt per fetch: no two requests of an
// agent come less than 8 s apart, the deferral included (F4, D2).
func TestRetryAfter8_OneAttemptNeverEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := devserver.New(devserver.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		answers := make([]devserver.Answer, 30)
		for i := range answers {
			answers[i] = devserver.Answer{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"8"}}, Body: `{"detail":"cloning"}`}
		}
		srv.ScriptPolicy(answers...)
		ln := newPipeListener()
		hs := &http.Server{Handler: srv}
		go func() { _ = hs.Serve(ln) }()
		cfg := defaultConfig(t)
		cfg.PolicyUpdaterConnRetry.Attempts = 1
		// The worst case: every draw 0, the earliest each jitter allows.
		rnd := func() float64 { return 0 }
		fo := fetcher.PolicyOptions(cfg)
		fo.ServerURL = "http://opal"
		fo.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: ln.dial}}
		fo.Rand = rnd
		var u *updater.Updater
		sched := scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: cfg.PolicyUpdaterMaxRetryAfter,
			MaxRounds: cfg.PolicyUpdaterMaxDeferredRounds, Rand: rnd, Fire: func() { u.Deferred() }})
		u = updater.New(updater.Options{Store: memstore.New(), Fetcher: fetcher.New(fo), Scheduler: sched,
			MinInterval: cfg.PolicyUpdaterMinFetchInterval})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = u.Run(ctx); close(done) }()
		u.Connect()
		time.Sleep(10 * time.Minute)
		var times []time.Time
		for _, r := range srv.Requests() {
			if r.Path == "/policy" {
				times = append(times, r.Time)
			}
		}
		if len(times) < 5 {
			t.Fatalf("%d requests in 10 min", len(times))
		}
		for i := 1; i < len(times); i++ {
			// Mutation: the deferral's jitter into [d/2, d] (4 s after 8 s).
			if gap := times[i].Sub(times[i-1]); gap < 8*time.Second {
				t.Fatalf("request %d came %v after a 503 with Retry-After: 8", i+1, gap)
			}
		}
		sched.Stop()
		u.Stop()
		cancel()
		<-done
		_ = hs.Close()
		srv.Close()
	})
}
