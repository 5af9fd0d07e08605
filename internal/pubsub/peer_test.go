package pubsub

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gorilla/websocket"
	"github.com/opal-go/opal-client/internal/testutil"
)

// peer is a scripted OPAL server reached over net.Pipe, so tests run inside
// a testing/synctest bubble on virtual time and can pin exact frames.
type peer struct {
	t      *testing.T
	mu     sync.Mutex
	refuse int // handshake status to answer with; 0 accepts
	// retryAfter, if set, is the Retry-After header of a refusal.
	retryAfter string
	noPump     bool // accepted conns are not read: a silently dead peer
	silent     bool // the upgrade request is read but never answered
	dials      []time.Time
	auth       []string
	conns      chan *srvConn
}

type frame struct {
	typ  int
	data []byte
}

// srvConn is the server end of one accepted socket; a pump reads it so the
// client's ping frames are always answered.
type srvConn struct {
	ws     *websocket.Conn
	frames chan frame
	err    error // why the pump stopped; read after frames is closed
}

func newPeer(t *testing.T) *peer {
	return &peer{t: t, conns: make(chan *srvConn, 16)}
}

func (p *peer) setRefuse(status int) {
	p.mu.Lock()
	p.refuse = status
	p.mu.Unlock()
}

func (p *peer) dialTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.dials...)
}

func (p *peer) dialer() *websocket.Dialer {
	return &websocket.Dialer{NetDialContext: func(context.Context, string, string) (net.Conn, error) {
		c, s := net.Pipe()
		go p.accept(s)
		return c, nil
	}}
}

type hijackRW struct {
	nc  net.Conn
	brw *bufio.ReadWriter
	h   http.Header
}

func (h *hijackRW) Header() http.Header         { return h.h }
func (h *hijackRW) Write(b []byte) (int, error) { return h.nc.Write(b) }
func (h *hijackRW) WriteHeader(int)             {}
func (h *hijackRW) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return h.nc, h.brw, nil
}

func (p *peer) accept(nc net.Conn) {
	br := bufio.NewReader(nc)
	req, err := http.ReadRequest(br)
	if err != nil {
		nc.Close()
		return
	}
	p.mu.Lock()
	p.dials = append(p.dials, time.Now()) // virtual time inside the bubble
	p.auth = append(p.auth, req.Header.Get("Authorization"))
	status, noPump, silent, ra := p.refuse, p.noPump, p.silent, p.retryAfter
	p.mu.Unlock()
	if silent {
		return // TCP up, no upgrade answer: the socket stays open
	}
	if status != 0 {
		hdr := ""
		if ra != "" {
			hdr = "Retry-After: " + ra + "\r\n"
		}
		fmt.Fprintf(nc, "HTTP/1.1 %d %s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n", status, http.StatusText(status), hdr)
		nc.Close()
		return
	}
	up := websocket.Upgrader{}
	ws, err := up.Upgrade(&hijackRW{nc: nc, brw: bufio.NewReadWriter(br, bufio.NewWriter(nc)), h: http.Header{}}, req, nil)
	if err != nil {
		nc.Close()
		return
	}
	ws.SetReadLimit(-1)
	sc := &srvConn{ws: ws, frames: make(chan frame, 64)}
	if !noPump {
		go func() {
			defer close(sc.frames)
			for {
				mt, b, err := ws.ReadMessage()
				if err != nil {
					sc.err = err
					return
				}
				sc.frames <- frame{mt, b}
			}
		}()
	}
	p.conns <- sc
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

var callIDRe = regexp.MustCompile(`"call_id":"([0-9a-f]{32})"`)

// next returns the next data frame from the client, failing if the socket
// ended first.
func (sc *srvConn) next(t *testing.T) []byte {
	t.Helper()
	f, ok := <-sc.frames
	if !ok {
		t.Fatal("client socket closed, wanted a frame")
	}
	if f.typ != websocket.TextMessage {
		t.Fatalf("frame type %d, want text (§2.1)", f.typ)
	}
	return f.data
}

func (sc *srvConn) send(t *testing.T, s string) {
	t.Helper()
	if err := sc.ws.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

// callID extracts the 32-hex call_id and returns the frame with it
// replaced by "ID", for exact comparison.
func callID(t *testing.T, b []byte) (string, string) {
	t.Helper()
	m := callIDRe.FindSubmatch(b)
	if m == nil {
		t.Fatalf("no 32-hex call_id in %s", b)
	}
	return string(m[1]), string(bytes.Replace(b, m[1], []byte("ID"), 1))
}

// connect plays the server side of §2.4 on the next socket and returns it.
func (p *peer) connect(t *testing.T) *srvConn {
	t.Helper()
	sc := <-p.conns
	id, _ := callID(t, sc.next(t)) // _ping_
	sc.send(t, `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"`+id+`"}}`)
	id, _ = callID(t, sc.next(t)) // subscribe
	sc.send(t, `{"request":null,"response":{"result":true,"result_type":"bool","call_id":"`+id+`"}}`)
	return sc
}

// recorder collects callback events in order.
type recorder struct {
	mu       sync.Mutex
	connects int
	notifies []string
	states   []bool
}

func (r *recorder) connectsN() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
}

func (r *recorder) notified() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.notifies...)
}

// harness runs a Client against p inside the current bubble.
type harness struct {
	c    *Client
	rec  *recorder
	logs *testutil.SyncBuffer
	stop func() error
}

func start(t *testing.T, p *peer, mod func(*Options)) *harness {
	t.Helper()
	rec := &recorder{}
	logs := &testutil.SyncBuffer{}
	o := Options{
		URL:    "ws://opal.test/ws",
		Token:  "s3cret-token",
		Topics: []string{"policy:.", "policy_data"},
		OnConnect: func() {
			rec.mu.Lock()
			rec.connects++
			rec.mu.Unlock()
		},
		OnNotify: func(topic string, data json.RawMessage) {
			rec.mu.Lock()
			rec.notifies = append(rec.notifies, topic+" "+string(data))
			rec.mu.Unlock()
		},
		OnState: func(up bool) {
			rec.mu.Lock()
			rec.states = append(rec.states, up)
			rec.mu.Unlock()
		},
		Clock:  clock.New(), // virtual inside the bubble
		Rand:   func() float64 { return 0.5 },
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Dialer: p.dialer(),
	}
	if mod != nil {
		mod(&o)
	}
	c := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	// A failed assertion must not leave the client running: the bubble
	// would then panic and hide the failure.
	t.Cleanup(func() { _ = stop() })
	return &harness{c: c, rec: rec, logs: logs, stop: stop}
}
