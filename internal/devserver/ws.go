package devserver

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"github.com/gorilla/websocket"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// wsConn is the server side of one pub/sub socket (§2.2, §2.3).
type wsConn struct {
	s      *Server
	ws     *websocket.Conn
	chanID string

	wmu sync.Mutex

	mu      sync.Mutex
	topics  map[string]bool
	pending map[string]chan *pubsub.Response
	done    chan struct{}
	// gotID is closed once the client answered _get_channel_id_ (only used
	// with Options.CallGetChannelID).
	gotID chan struct{}
}

func newWSConn(s *Server, ws *websocket.Conn) *wsConn {
	return &wsConn{
		s: s, ws: ws, chanID: pubsub.NewCallID(),
		topics:  map[string]bool{},
		pending: map[string]chan *pubsub.Response{},
		done:    make(chan struct{}),
		gotID:   make(chan struct{}),
	}
}

func (c *wsConn) subscribed(t string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topics[t]
}

func (c *wsConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.ws.WriteMessage(websocket.TextMessage, b)
}

var errGone = errors.New("devserver: socket closed")

// call sends a request and waits for its answer.
func (c *wsConn) call(method string, args any) (*pubsub.Response, error) {
	b, id, err := pubsub.NewRequest(method, args)
	if err != nil {
		return nil, err
	}
	ch := make(chan *pubsub.Response, 1)
	c.mu.Lock()
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()
	if err := c.write(b); err != nil {
		return nil, err
	}
	t := c.s.o.Clock.Timer(c.s.o.NotifyTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r, nil
	case <-c.done:
		return nil, errGone
	case <-t.C:
		return nil, errors.New("devserver: no answer in time")
	}
}

func (c *wsConn) notify(topic string, data any) error {
	args := map[string]any{
		"subscription": map[string]any{"id": pubsub.NewCallID(), "subscriber_id": c.chanID, "topic": topic, "notifier_id": nil},
		"data":         data,
	}
	_, err := c.call("notify", args)
	return err
}

func (c *wsConn) serve(ctx context.Context) {
	defer close(c.done)
	defer c.ws.Close()
	if c.s.o.CallGetChannelID {
		go func() {
			if _, err := c.call("_get_channel_id_", nil); err == nil {
				close(c.gotID)
			}
		}()
	} else {
		close(c.gotID)
	}
	for {
		mt, b, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		if mt != websocket.TextMessage {
			c.s.log.Warn("binary frame: dropping the connection, like the Python server")
			return
		}
		var m pubsub.Message
		if err := json.Unmarshal(b, &m); err != nil {
			c.s.log.Warn("malformed frame", "err", err)
			return
		}
		if r := m.Response; r != nil {
			c.mu.Lock()
			ch := c.pending[r.CallID]
			c.mu.Unlock()
			if ch != nil {
				select {
				case ch <- r:
				default:
				}
			}
		}
		if r := m.Request; r != nil {
			// Served concurrently so a subscribe waiting for the channel id
			// does not stop the read loop that delivers that answer.
			go c.answer(ctx, r)
		}
	}
}

func (c *wsConn) answer(ctx context.Context, r *pubsub.Request) {
	var result any
	typ := "str"
	switch r.Method {
	case "_ping_", "ping":
		result = "pong"
	case "_get_channel_id_":
		result = c.chanID
	case "subscribe", "unsubscribe":
		var args struct {
			Topics []string `json:"topics"`
		}
		_ = json.Unmarshal(r.Arguments, &args)
		if r.Method == "subscribe" {
			select { // §2.3: a statistics server waits for the channel id
			case <-c.gotID:
			case <-c.done:
				return
			case <-ctx.Done():
				return
			}
		}
		c.mu.Lock()
		for _, t := range args.Topics {
			c.topics[t] = r.Method == "subscribe"
		}
		c.mu.Unlock()
		result, typ = true, "bool"
	case "publish":
		var args struct {
			Topics []string        `json:"topics"`
			Data   json.RawMessage `json:"data"`
		}
		_ = json.Unmarshal(r.Arguments, &args)
		go c.s.Publish(args.Topics, args.Data)
		result, typ = true, "bool"
	default:
		c.s.log.Warn("unknown method", "method", r.Method)
		return
	}
	b, err := pubsub.NewResponse(r.CallID, result, typ)
	if err == nil {
		_ = c.write(b)
	}
}
