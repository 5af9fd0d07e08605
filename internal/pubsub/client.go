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
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gorilla/websocket"

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
