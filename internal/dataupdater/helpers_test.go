package dataupdater_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/dataupdater"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/updater"
)

const token = "SECRET-CLIENT-TOKEN"

// reply is one scripted answer of a fake source. hang blocks until the
// request is cancelled; gate, if set, is waited on first.
type reply struct {
	status     int
	body       string
	retryAfter string
	location   string
	hang       bool
	gate       chan struct{}
	refused    bool // a connection error
}

// sources is an in-memory http.RoundTripper: scripted answers per path
// (the last one repeats) and a record of the requests.
type sources struct {
	mu     sync.Mutex
	script map[string][]reply
	reqs   []*http.Request
	bodies map[*http.Request]string
}

func (s *sources) body(r *http.Request) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[r]
}

func (s *sources) set(path string, r ...reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.script == nil {
		s.script = map[string][]reply{}
	}
	s.script[path] = r
}

func (s *sources) requests(path string) []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*http.Request
	for _, r := range s.reqs {
		if r.URL.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func (s *sources) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	if s.bodies == nil {
		s.bodies = map[*http.Request]string{}
	}
	s.bodies[req] = string(body)
	sc := s.script[req.URL.Path]
	var r reply
	switch {
	case len(sc) == 0:
		r = reply{status: 404, body: `{"detail":"no such source"}`}
	case len(sc) == 1:
		r = sc[0]
	default:
		r, s.script[req.URL.Path] = sc[0], sc[1:]
	}
	s.mu.Unlock()
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	if r.refused {
		return nil, errors.New("dial tcp: connection refused")
	}
	if r.hang {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if r.retryAfter != "" {
		h.Set("Retry-After", r.retryAfter)
	}
	if r.location != "" {
		h.Set("Location", r.location)
	}
	return &http.Response{StatusCode: r.status, Header: h, Body: io.NopCloser(strings.NewReader(r.body)),
		ContentLength: int64(len(r.body)), Request: req}, nil
}

// dataStore is an in-memory dataupdater.Store: one JSON document, written
// all-or-nothing.
type dataStore struct {
	mu     sync.Mutex
	doc    any
	writes int
	fail   error
}

func (d *dataStore) WriteData(_ context.Context, w dataupdater.Write) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return d.fail
	}
	doc := d.doc
	if doc == nil {
		doc = map[string]any{}
	}
	ptr := ""
	for _, s := range w.Path {
		ptr += "/" + s
	}
	var ops []dataupdater.PatchOp
	if w.Method == dataupdater.MethodPatch {
		for _, op := range w.Patch {
			op.Path = ptr + op.Path
			if op.From != "" {
				op.From = ptr + op.From
			}
			ops = append(ops, op)
		}
	} else {
		// Create the missing parents, then add.
		doc, _ = dataupdater.ApplyPatch(doc, nil) // a copy
		m, _ := doc.(map[string]any)
		for i := 0; i+1 < len(w.Path) && m != nil; i++ {
			c, ok := m[w.Path[i]].(map[string]any)
			if !ok {
				c = map[string]any{}
				m[w.Path[i]] = c
			}
			m = c
		}
		b, _ := json.Marshal(w.Value)
		ops = append(ops, mustOps(`[{"op":"add","path":`+quote(ptr)+`,"value":`+string(b)+`}]`)...)
	}
	next, err := dataupdater.ApplyPatch(doc, ops)
	if err != nil {
		return err
	}
	d.doc = next
	d.writes++
	return nil
}

func (d *dataStore) json() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, _ := json.Marshal(d.doc)
	return string(b)
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func mustOps(s string) []dataupdater.PatchOp {
	ops, err := dataupdater.DecodePatch([]byte(s))
	if err != nil {
		panic(err)
	}
	return ops
}

// rig is a data updater with the real update queue (and a memstore for
// policy), in-memory sources, a fake data store and a mock clock, in a
// synctest bubble.
type rig struct {
	t   *testing.T
	clk *clock.Mock
	src *sources
	st  *dataStore
	pol *memstore.Store
	q   *updater.Updater
	du  *dataupdater.Updater

	log *testutil.LogRecorder

	mu       sync.Mutex
	txs      []updater.Transaction
	outcomes []string
	arms     []time.Duration
}

type rigOpt struct {
	topics     []string
	noSources  bool
	reschedule bool
	report     bool
	retry      config.ConnRetryOptions
	polFetch   updater.Fetcher
}

func newRig(t *testing.T, o rigOpt) *rig {
	r := &rig{t: t, clk: clock.NewMock(), src: &sources{}, st: &dataStore{}, pol: memstore.New(), log: &testutil.LogRecorder{}}
	if o.topics == nil {
		o.topics = []string{"policy_data"}
	}
	if o.retry == (config.ConnRetryOptions{}) {
		o.retry = config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: time.Second, Attempts: 3, MaxWait: time.Second}
	}
	pf := o.polFetch
	if pf == nil {
		pf = fetcher.New(fetcher.Options{ServerURL: "http://opal", HTTPClient: &http.Client{Transport: r.src}, Clock: r.clk})
	}
	r.q = updater.New(updater.Options{Store: r.pol, Fetcher: pf, Clock: r.clk, Logger: slog.New(r.log)})
	srcURL := "http://opal/data/config"
	if o.noSources {
		srcURL = ""
	}
	r.du = dataupdater.New(dataupdater.Options{
		Store: r.st, Queue: r.q, Topics: o.topics, SourcesURL: srcURL, Token: token,
		Retry: o.retry, MaxRetryAfter: 60 * time.Second, AttemptTimeout: 5 * time.Second, FetchTimeout: 10 * time.Second,
		Reschedule: o.reschedule, MaxDeferredRounds: 3, Report: o.report, Callbacks: []string{"http://opal/data/callback_report"},
		HTTPClient: &http.Client{Transport: r.src}, Clock: r.clk, Rand: func() float64 { return 0.5 }, Logger: slog.New(r.log),
		Jitter: func(d time.Duration) time.Duration { return d },
		OnTransaction: func(tx updater.Transaction) {
			r.mu.Lock()
			r.txs = append(r.txs, tx)
			r.mu.Unlock()
		},
		OnOutcome: func(s string) {
			r.mu.Lock()
			r.outcomes = append(r.outcomes, s)
			r.mu.Unlock()
		},
		OnArm: func(_ string, _ int, d time.Duration) {
			r.mu.Lock()
			r.arms = append(r.arms, d)
			r.mu.Unlock()
		},
	})
	done := make(chan struct{})
	go func() { defer close(done); r.q.Run(context.Background()) }()
	t.Cleanup(func() {
		r.du.Stop()
		r.q.Stop()
		<-done
	})
	return r
}

// advance moves the mock clock in small steps, letting the bubble settle
// after each, so timers created by woken goroutines fire on time.
func (r *rig) advance(d time.Duration) {
	const step = 100 * time.Millisecond
	synctest.Wait()
	for ; d > 0; d -= step {
		r.clk.Add(min(step, d))
		synctest.Wait()
	}
}

func (r *rig) outcomesList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.outcomes...)
}

func (r *rig) transactions() []updater.Transaction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]updater.Transaction(nil), r.txs...)
}

func (r *rig) lastArm() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.arms) == 0 {
		return 0
	}
	return r.arms[len(r.arms)-1]
}

func (r *rig) notify(msg string) {
	r.du.OnNotify("policy_data", json.RawMessage(msg))
}

func (r *rig) wantDoc(want string) {
	r.t.Helper()
	synctest.Wait()
	if got := r.st.json(); got != want {
		r.t.Fatalf("data = %s, want %s", got, want)
	}
}

func bubble(t *testing.T, f func(t *testing.T)) { synctest.Test(t, f) }

func cfgFixed(wait time.Duration, attempts int) config.ConnRetryOptions {
	return config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: wait, Attempts: attempts, MaxWait: wait}
}
