// Package pubsub is the OPAL pub/sub client: one WebSocket to the server's
// /ws endpoint speaking the fastapi_websocket_rpc envelope (opal-protocol
// §2), subscribed to every topic at once, reconnecting forever with jittered
// exponential backoff.
//
// The client never does work itself: each (re)connect and each notify is
// handed to a callback that must only enqueue, so the server, which awaits
// every notify answer (§2.5), is never held up.
package pubsub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gorilla/websocket"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/backoff"
)

// Defaults for the zero values of Options.
const (
	DefaultMaxMessageBytes  = 64 << 20 // inline data updates can be large (§2.1)
	DefaultPingInterval     = 20 * time.Second
	DefaultReadTimeout      = 60 * time.Second
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultSubscribeTimeout = 30 * time.Second
	DefaultStableAfter      = 30 * time.Second
	DefaultReconnectSpread  = 15 * time.Second
	DefaultReconnectMaxWait = 55 * time.Second
)

// Start-up backoff bounds: the first retry of a client that never connected
// waits about MinBackoff, later ones grow to MaxBackoff (the Python
// client's wait_random_exponential(min=0.1, max=120)), and never past
// Options.ReconnectMaxWait.
const (
	MinBackoff = 100 * time.Millisecond
	MaxBackoff = 120 * time.Second
)

// Options configure a Client. Only URL is required.
type Options struct {
	URL   string // ws:// or wss:// pub/sub endpoint
	Token string // sent as "Authorization: Bearer <Token>" when not empty
	// Topics are subscribed in one call (§2.4): policy topics (§3.1) and,
	// when the data updater is on, data topics (§6.1).
	Topics []string
	// OnConnect is called once per successful connect+subscribe. It must
	// only enqueue.
	OnConnect func()
	// OnNotify is called for each notify on a subscribed topic, before the
	// notify is answered. It must only enqueue.
	OnNotify func(topic string, data json.RawMessage)
	// OnState reports connected (after subscribe) and disconnected.
	OnState func(connected bool)
	// KeepAlive > 0 sends an RPC _ping_ this often (OPAL_KEEP_ALIVE_INTERVAL, §2.6).
	KeepAlive time.Duration
	// MaxMessageBytes is the read limit for one frame; a larger frame ends
	// the connection. Default DefaultMaxMessageBytes.
	MaxMessageBytes int64
	// PingInterval is the WebSocket ping frame cadence; ReadTimeout closes a
	// connection on which nothing at all was received for that long, so a
	// silently dead peer is found within ReadTimeout.
	PingInterval, ReadTimeout time.Duration
	// HandshakeTimeout and SubscribeTimeout bound the connect sequence.
	HandshakeTimeout, SubscribeTimeout time.Duration
	// StableAfter: a connection that stayed subscribed this long ends with
	// a fresh reconnect schedule (the spread window first); a shorter one
	// (a flapping server) keeps growing the schedule where it was.
	StableAfter time.Duration
	// ReconnectSpread (OPAL_PUBSUB_RECONNECT_SPREAD): after an established
	// connection ends, the first reconnect waits uniformly in
	// [MinBackoff, ReconnectSpread], so a server restart that drops every
	// socket is not answered by a burst of handshakes. Later failures wait
	// ReconnectSpread*2^(n-1), capped at ReconnectMaxWait, drawn into
	// [0.9d, d]. Default DefaultReconnectSpread; the Python client
	// reconnects at once.
	ReconnectSpread time.Duration
	// ReconnectMaxWait (OPAL_PUBSUB_RECONNECT_MAX_WAIT) caps every wait
	// between connection attempts, so an agent is back at most this long
	// after the server is. Default DefaultReconnectMaxWait.
	ReconnectMaxWait time.Duration
	// MaxRetryAfter caps the Retry-After of a refused handshake (503, 429):
	// the next attempt waits at least the capped hint, spread upward
	// (backoff.Up). 0 honours no hint. The agent passes
	// OPAL_POLICY_UPDATER_MAX_RETRY_AFTER, the cap of fetches.
	MaxRetryAfter time.Duration
	Clock         clock.Clock
	Rand          func() float64 // uniform in [0,1), for the backoff jitter
	Logger        *slog.Logger
	// Statistics, if set, announces the client on the server's statistics
	// channel after every subscribe (stats.go).
	Statistics *Statistics
	// Dialer is copied; tests inject NetDialContext (e.g. over net.Pipe).
	// NetDialTLSContext, if set, bypasses the read-timeout watchdog's byte
	// counting, so leave it nil.
	Dialer *websocket.Dialer
}

// HandshakeError is a WebSocket handshake the server answered with a status
// other than 101 (403 for a bad token, §2.1).
type HandshakeError struct {
	Status int
	// RetryAfter is the parsed Retry-After of a 503 or 429, valid when
	// HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	Err           error
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("pubsub handshake refused: status %d", e.Status)
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// ErrClosed is returned by calls pending when the connection ended.
var ErrClosed = errors.New("pubsub: connection closed")

// ErrTimeout is returned by a call whose answer did not come in time.
var ErrTimeout = errors.New("pubsub: call timed out")

// Client is the pub/sub client. Create it with New and run it with Run.
type Client struct {
	o   Options
	log *slog.Logger
}

// New returns a Client with defaults filled in.
func New(o Options) *Client {
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.PingInterval >= o.ReadTimeout {
		// A healthy idle peer must get a ping to answer before the watchdog fires.
		o.PingInterval = o.ReadTimeout / 2
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.SubscribeTimeout <= 0 {
		o.SubscribeTimeout = DefaultSubscribeTimeout
	}
	if o.StableAfter <= 0 {
		o.StableAfter = DefaultStableAfter
	}
	if o.ReconnectSpread <= 0 {
		o.ReconnectSpread = DefaultReconnectSpread
	}
	if o.ReconnectMaxWait <= 0 {
		o.ReconnectMaxWait = DefaultReconnectMaxWait
	}
	o.ReconnectSpread = max(o.ReconnectSpread, MinBackoff)
	o.ReconnectMaxWait = max(o.ReconnectMaxWait, MinBackoff)
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	if o.Rand == nil {
		o.Rand = defaultRand
	}
	if o.Dialer == nil {
		o.Dialer = websocket.DefaultDialer
	}
	o.Statistics = o.Statistics.withDefaults()
	l := o.Logger
	if l == nil {
		l = slog.Default()
	}
	return &Client{o: o, log: l.With("component", "pubsub")}
}

// Backoff is the wait before reconnect attempt number attempt (1 = the first
// retry after a failure or after a stable connection ended), given a uniform
// draw rnd in [0,1): uniform in [MinBackoff, min(MaxBackoff, MinBackoff*2^attempt)]
// ("full jitter" above a floor). The floor keeps even a zero draw from
// becoming a hot loop; the doubling saturates, so any attempt count is safe.
func Backoff(attempt int, rnd float64) time.Duration {
	return backoff.New(reconnectPolicy, nil, func() float64 { return rnd }).Wait(attempt)
}

// reconnectPolicy is the reconnect backoff: full jitter above MinBackoff,
// the step after failure n being MinBackoff*2^n, capped at MaxBackoff.
var reconnectPolicy = backoff.Policy{Name: "pubsub reconnect", Base: MinBackoff, Max: MaxBackoff,
	Floor: MinBackoff, Jitter: backoff.JitterFull, StepOffset: 1}

// Reconnect is the reconnect schedule of one client (pure, so the fleet
// simulator runs the same code): Next is the wait before the next
// connection attempt, given how the last one ended.
type Reconnect struct {
	Spread, MaxWait, StableAfter, MaxRetryAfter time.Duration
	Rand                                        func() float64

	failures  int  // failed attempts since the last established connection
	connected bool // a connection was ever established
}

// NewReconnect returns the schedule of o's settings (defaults filled).
func NewReconnect(o Options) *Reconnect {
	o = New(o).o
	return &Reconnect{Spread: o.ReconnectSpread, MaxWait: o.ReconnectMaxWait, StableAfter: o.StableAfter,
		MaxRetryAfter: o.MaxRetryAfter, Rand: o.Rand}
}

// Next is the wait after an attempt that stayed subscribed for up (0: it
// never got there) and ended with err.
func (r *Reconnect) Next(up time.Duration, err error) time.Duration {
	var d time.Duration
	if up > 0 {
		r.connected = true
	}
	switch {
	case up > 0 && (up >= r.StableAfter || r.failures == 0):
		// An established connection ended: spread the first reconnect.
		r.failures = 0
		d = backoff.Full(MinBackoff, r.Spread, r.Rand())
	case r.connected:
		// Reconnecting (or flapping): grow from the spread, capped. The
		// first wait at the cap is drawn over the whole cap, so the
		// phases of a fleet that dropped together cover the cadence; the
		// later ones stay near the cap (few attempts, a bounded return).
		r.failures++
		step := backoff.Exponential(r.Spread, r.failures, r.MaxWait)
		if step == r.MaxWait && backoff.Exponential(r.Spread, r.failures-1, r.MaxWait) < r.MaxWait {
			d = backoff.Full(MinBackoff, step, r.Rand())
		} else {
			d = backoff.Narrow(step, r.Rand())
		}
	default:
		// Never connected yet: start-up is quick, then grows.
		r.failures++
		d = min(Backoff(r.failures, r.Rand()), r.MaxWait)
	}
	var he *HandshakeError
	if errors.As(err, &he) && he.HasRetryAfter && r.MaxRetryAfter > 0 {
		// A refused handshake's Retry-After, under the cap of fetches.
		h := min(he.RetryAfter, r.MaxRetryAfter)
		d = max(d, backoff.Up(h, r.MaxRetryAfter, r.Rand()))
	}
	return d
}

// Run connects, subscribes and serves notifies, reconnecting forever until
// ctx is done, when it closes the socket cleanly and returns ctx.Err().
func (c *Client) Run(ctx context.Context) error {
	rc := &Reconnect{Spread: c.o.ReconnectSpread, MaxWait: c.o.ReconnectMaxWait, StableAfter: c.o.StableAfter,
		MaxRetryAfter: c.o.MaxRetryAfter, Rand: c.o.Rand}
	for {
		up, err := c.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := rc.Next(up, err)
		var he *HandshakeError
		switch {
		case errors.As(err, &he):
			c.log.Warn("pub/sub handshake refused", "status", he.Status, "attempt", rc.failures, "retry_in", d)
		case up > 0:
			c.log.Warn("pub/sub connection lost", "err", err, "up", up, "retry_in", d)
		default:
			c.log.Warn("pub/sub connect failed", "err", err, "attempt", rc.failures, "retry_in", d)
		}
		if !backoff.Sleep(ctx, c.o.Clock, d) {
			return ctx.Err()
		}
	}
}

// session runs one connection. up is how long it stayed subscribed (0 if it
// never got there).
func (c *Client) session(ctx context.Context) (up time.Duration, err error) {
	s := &session{
		c:       c,
		pending: map[string]chan *Response{},
		topics:  map[string]bool{},
		done:    make(chan struct{}),
		chanID:  NewCallID(),
	}
	for _, t := range c.o.Topics {
		s.topics[t] = true
	}
	s.touch()
	d := *c.o.Dialer
	base := d.NetDialContext
	if base == nil {
		base = (&net.Dialer{}).DialContext
	}
	// gorilla stops watching ctx once TCP is up: a server that accepts but
	// never answers the upgrade would hold a cancelled Run (SIGTERM) until
	// the handshake deadline. Closing the socket on ctx.Done ends the read.
	var unwatch func() bool
	d.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := base(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		unwatch = context.AfterFunc(ctx, func() { nc.Close() })
		return &liveConn{Conn: nc, touch: s.touch}, nil
	}
	d.HandshakeTimeout = 0 // bounded below on the injected clock instead
	hdr := http.Header{}
	if c.o.Token != "" {
		hdr.Set("Authorization", "Bearer "+c.o.Token)
	}
	hctx, cancel := c.o.Clock.WithTimeout(ctx, c.o.HandshakeTimeout)
	conn, resp, err := d.DialContext(hctx, c.o.URL, hdr)
	if unwatch != nil && !unwatch() && err == nil {
		conn.Close() // the watch fired after the handshake: hctx is done
		err = hctx.Err()
	}
	cancel()
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		if resp != nil {
			he := &HandshakeError{Status: resp.StatusCode, Err: err}
			if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
				he.RetryAfter, he.HasRetryAfter = fetcher.ParseRetryAfter(resp.Header.Get("Retry-After"), c.o.Clock.Now())
			}
			return 0, he
		}
		return 0, err
	}
	s.conn = conn
	conn.SetReadLimit(c.o.MaxMessageBytes)
	s.wg.Add(3)
	go s.read()
	go s.watchdog()
	go s.pinger()
	defer func() {
		if ctx.Err() != nil {
			s.closeFrame() // even mid-handshake: leave the server a clean close
		}
		s.shutdown()
	}()

	// §2.4: _ping_ up to 5 times, 1 s each, then carry on regardless.
	for range 5 {
		_, err := s.call(ctx, "_ping_", nil, time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrTimeout) {
			return 0, err
		}
	}
	r, err := s.call(ctx, "subscribe", map[string][]string{"topics": c.o.Topics}, c.o.SubscribeTimeout)
	if err != nil {
		return 0, fmt.Errorf("subscribe: %w", err)
	}
	if string(r.Result) != "true" {
		// The Python client ignores this too; a topic outside the token's
		// permitted_topics is the usual cause.
		c.log.Warn("pub/sub subscribe refused by server", "result", string(r.Result))
	}
	start := c.o.Clock.Now()
	if c.o.OnState != nil {
		c.o.OnState(true)
		defer c.o.OnState(false)
	}
	c.log.Info("pub/sub connected", "topics", len(c.o.Topics))
	if c.o.OnConnect != nil {
		c.o.OnConnect()
	}
	if c.o.Statistics != nil {
		s.wg.Add(1)
		go s.announce(ctx)
	}
	if c.o.KeepAlive > 0 {
		s.wg.Add(1)
		go s.keepAlive()
	}
	select {
	case <-ctx.Done():
		return c.o.Clock.Since(start), ctx.Err()
	case <-s.done:
		return c.o.Clock.Since(start), s.readErr
	}
}

// liveConn notes every received byte, so the watchdog sees a slow but alive
// peer (a big frame arriving) as alive.
type liveConn struct {
	net.Conn
	touch func()
}

func (l *liveConn) Read(p []byte) (int, error) {
	n, err := l.Conn.Read(p)
	if n > 0 {
		l.touch()
	}
	return n, err
}

type session struct {
	c      *Client
	conn   *websocket.Conn
	chanID string
	topics map[string]bool
	last   atomic.Int64 // clock time of the last received byte, UnixNano

	wmu sync.Mutex // one writer at a time (gorilla's rule)

	mu      sync.Mutex
	pending map[string]chan *Response

	done    chan struct{} // closed when the reader exits
	readErr error
	wg      sync.WaitGroup
}

func (s *session) touch() { s.last.Store(s.c.o.Clock.Now().UnixNano()) }

func (s *session) shutdown() {
	s.conn.Close()
	s.wg.Wait()
}

// closeFrame does the close handshake: send a normal closure and wait for
// the peer's reply (the reader then ends), at most a second.
func (s *session) closeFrame() {
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Time{})
	}()
	t := s.c.o.Clock.Timer(time.Second)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	}
	s.conn.Close()
	<-sent
}

func (s *session) write(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.conn.WriteMessage(websocket.TextMessage, b)
}

func (s *session) read() {
	defer s.wg.Done()
	defer close(s.done)
	for {
		mt, data, err := s.conn.ReadMessage()
		if err != nil {
			s.readErr = err
			return
		}
		if mt != websocket.TextMessage {
			// §2.1: the protocol is text frames only.
			s.c.log.Warn("pub/sub: dropping non-text frame", "type", mt, "bytes", len(data))
			continue
		}
		s.handle(data)
	}
}

func (s *session) handle(data []byte) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		s.c.log.Warn("pub/sub: dropping malformed frame", "err", err, "bytes", len(data))
		return
	}
	if m.Request == nil && m.Response == nil {
		s.c.log.Warn("pub/sub: dropping frame with neither request nor response")
		return
	}
	if m.Response != nil {
		s.mu.Lock()
		ch := s.pending[m.Response.CallID]
		delete(s.pending, m.Response.CallID)
		s.mu.Unlock()
		if ch == nil {
			s.c.log.Debug("pub/sub: response for unknown call_id ignored", "call_id", m.Response.CallID)
		} else {
			ch <- m.Response
		}
	}
	if m.Request != nil {
		s.serve(m.Request)
	}
}

// serve answers the methods of §2.3 at once.
func (s *session) serve(r *Request) {
	switch r.Method {
	case "notify":
		s.notify(r)
		s.respond(r.CallID, "None")
	case "_ping_":
		s.respond(r.CallID, "pong")
	case "_get_channel_id_":
		// A server with OPAL_STATISTICS_ENABLED waits for this before it
		// answers subscribe (§2.3).
		s.respond(r.CallID, s.chanID)
	default:
		// The Python side has no error responses; closing would cost every
		// subscription, so log and drop.
		s.c.log.Warn("pub/sub: dropping call to unknown method", "method", r.Method)
	}
}

func (s *session) notify(r *Request) {
	var args struct {
		Subscription *struct {
			Topic string `json:"topic"`
		} `json:"subscription"`
		Data json.RawMessage `json:"data"`
	}
	if len(r.Arguments) > 0 {
		if err := json.Unmarshal(r.Arguments, &args); err != nil {
			s.c.log.Warn("pub/sub: dropping notify with malformed arguments", "err", err)
			return
		}
	}
	if args.Subscription == nil {
		s.c.log.Warn("pub/sub: dropping notify without subscription")
		return
	}
	topic := args.Subscription.Topic
	if !s.topics[topic] {
		s.c.log.Warn("pub/sub: dropping notify for a topic not subscribed", "topic", topic)
		return
	}
	if len(args.Data) == 0 {
		args.Data = json.RawMessage("null")
	}
	if s.c.o.OnNotify != nil {
		s.c.o.OnNotify(topic, args.Data)
	}
}

func (s *session) respond(callID, result string) {
	b, err := NewResponse(callID, result, "str")
	if err == nil {
		err = s.write(b)
	}
	if err != nil {
		s.c.log.Debug("pub/sub: answer not sent", "err", err)
	}
}

// call sends a request and waits for its answer, the connection's end, ctx,
// or timeout on the injected clock.
func (s *session) call(ctx context.Context, method string, args any, timeout time.Duration) (*Response, error) {
	b, id, err := NewRequest(method, args)
	if err != nil {
		return nil, err
	}
	ch := make(chan *Response, 1)
	s.mu.Lock()
	s.pending[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
	}()
	if err := s.write(b); err != nil {
		return nil, err
	}
	t := s.c.o.Clock.Timer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r, nil
	case <-s.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, ErrTimeout
	}
}

// watchdog closes a connection on which nothing was received for
// ReadTimeout: the read deadline, kept on the injected clock.
func (s *session) watchdog() {
	defer s.wg.Done()
	rt := s.c.o.ReadTimeout
	for {
		wait := time.Duration(s.last.Load()+int64(rt)) - time.Duration(s.c.o.Clock.Now().UnixNano())
		if wait <= 0 {
			s.c.log.Warn("pub/sub: peer silent, closing", "read_timeout", rt)
			s.conn.Close() // ends the reader, and so the session
			return
		}
		t := s.c.o.Clock.Timer(wait)
		select {
		case <-s.done:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// pinger sends WebSocket ping frames so a healthy peer always has something
// to answer within ReadTimeout.
func (s *session) pinger() {
	s.every(s.c.o.PingInterval, func() error {
		return s.conn.WriteControl(websocket.PingMessage, nil, time.Time{})
	})
}

// keepAlive sends RPC _ping_ calls (§2.6). Like the Python client it does
// not wait for the answer; dead peers are the watchdog's job.
func (s *session) keepAlive() {
	s.every(s.c.o.KeepAlive, func() error {
		b, _, err := NewRequest("_ping_", nil)
		if err != nil {
			return err
		}
		return s.write(b)
	})
}

// every calls f on each tick of d until the session ends or f fails.
func (s *session) every(d time.Duration, f func() error) {
	defer s.wg.Done()
	tk := s.c.o.Clock.Ticker(d)
	defer tk.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tk.C:
			if err := f(); err != nil {
				return
			}
		}
	}
}
