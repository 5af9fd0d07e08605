// This file is one connection's state and its frames: the reader, the answers
// to the server's calls (§2.3) and the calls the client sends.

package pubsub

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

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
