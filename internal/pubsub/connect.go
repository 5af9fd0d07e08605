// This file is one connection attempt: the WebSocket handshake (bounded on
// the injected clock, ended by ctx), the opening _ping_ and subscribe calls,
// and the wait for the connection to end.

package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/opal-go/opal-client/fetcher"
)

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
