// This file keeps a connection honest: the read-timeout watchdog that finds
// a silently dead peer, WebSocket pings, and the RPC keep-alive (§2.6).

package pubsub

import (
	"time"

	"github.com/gorilla/websocket"
)

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
