// Package devserver is a protocol-compatible OPAL server for development,
// tests and benchmarks (opal-protocol §2-§4, §6.3, §9). It serves a directory
// of policies as bundles, publishes change notifications over the pub/sub
// WebSocket, and can misbehave on demand: scripted answers for any route,
// stalled or truncated bodies, dropped or refused sockets, slow delivery.
// Every request is recorded with its time so a test can assert how a client
// behaved.
package devserver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gorilla/websocket"
)

// Options configure a Server. Everything is optional.
type Options struct {
	// PolicyDir is served as the policy repository; empty serves an empty one.
	PolicyDir string
	// Token, when set, is required as "Authorization: Bearer <Token>": HTTP
	// routes answer 401 without it, /ws refuses the handshake with 403 (§2.1).
	Token string
	// DataConfig is the body of /data/config. Nil serves the stock default:
	// one entry pointing at this server's /policy-data (§6.3).
	DataConfig json.RawMessage
	// PolicyData is the body of /policy-data; nil serves {}.
	PolicyData json.RawMessage
	// DataDir holds data sources: each *.json file is served at
	// DataSourcesPrefix+<its path>, and, unless DataConfig is set,
	// /data/config lists one entry per file instead of the stock default.
	DataDir string
	// CallGetChannelID makes the server behave like one with
	// OPAL_STATISTICS_ENABLED: it calls _get_channel_id_ on each client and
	// answers subscribe only after that answer (§2.3).
	CallGetChannelID bool
	// NotifyTimeout bounds the wait for one notify answer; default 10 s.
	NotifyTimeout time.Duration
	Clock         clock.Clock
	Logger        *slog.Logger
}

// Answer is one scripted response. A zero Status passes the request through
// to the real handler.
type Answer struct {
	Status int
	Header http.Header // e.g. {"Retry-After": {"30"}}
	Body   string
	// Stall sends the status, headers and Body, then holds the response
	// open until the client gives up or the server is closed.
	Stall bool
	// Truncate announces more bytes than Body and cuts the connection after
	// Body.
	Truncate bool
}

// Record is one request the server saw. Status is 101 for an accepted
// WebSocket.
type Record struct {
	Time   time.Time
	Method string
	Path   string
	Query  string
	Status int
}

// Server is the dev OPAL server; it is an http.Handler.
type Server struct {
	o    Options
	log  *slog.Logger
	mux  *http.ServeMux
	stop chan struct{} // closed by Close: releases stalled answers

	mu          sync.Mutex
	snaps       map[string]*snapshot
	cur         *snapshot
	scripts     map[string][]Answer
	records     []Record
	refuse      int
	notifyDelay time.Duration
	conns       map[*wsConn]bool
	closed      bool
}

// New builds a Server and reads PolicyDir once. A directory that cannot be
// read serves an empty repository and is logged.
func New(o Options) *Server {
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	if o.NotifyTimeout <= 0 {
		o.NotifyTimeout = 10 * time.Second
	}
	l := o.Logger
	if l == nil {
		l = slog.Default()
	}
	s := &Server{
		o:       o,
		log:     l.With("component", "devserver"),
		stop:    make(chan struct{}),
		snaps:   map[string]*snapshot{},
		scripts: map[string][]Answer{},
		conns:   map[*wsConn]bool{},
	}
	s.cur = &snapshot{files: map[string]string{}, dirs: map[string]bool{".": true}}
	if o.PolicyDir != "" {
		snap, err := readSnapshot(o.PolicyDir)
		if err != nil {
			s.log.Error("reading policy dir", "err", err)
		} else {
			s.cur = snap
		}
	}
	if s.cur.hash == "" {
		s.cur.hash = "da39a3ee5e6b4b0d3255bfef95601890afd80709" // sha1 of no files
	}
	s.snaps[s.cur.hash] = s.cur
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /policy", s.handlePolicy)
	s.mux.HandleFunc("GET /scopes/{id}/policy", s.handlePolicy)
	s.mux.HandleFunc("GET /data/config", s.handleDataConfig)
	s.mux.HandleFunc("GET /policy-data", s.handlePolicyData)
	s.mux.HandleFunc("GET /ws", s.handleWS)
	s.mux.HandleFunc("GET "+DataSourcesPrefix+"{file...}", s.handleDataSource)
	s.mux.HandleFunc("POST /admin/data-update", s.handleAdminDataUpdate)
	s.mux.HandleFunc("POST /admin/publish", s.handleAdminPublish)
	s.mux.HandleFunc("POST /admin/drop-sockets", s.handleAdminDropSockets)
	s.mux.HandleFunc("POST /admin/script", s.handleAdminScript)
	s.mux.HandleFunc("GET /admin/requests", s.handleAdminRequests)
	return s
}

// Hash is the current policy hash.
func (s *Server) Hash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.hash
}

// Close drops every socket and releases stalled answers. The Server keeps
// serving plain requests (the caller owns the listener).
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.DropAllSockets()
}

// Script queues answers for path (e.g. "/policy", "/data/config"): each
// request to that path takes the next one; when they run out the route
// serves normally again.
func (s *Server) Script(path string, answers ...Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[path] = append(s.scripts[path], answers...)
}

// ScriptPolicy is Script("/policy", answers...).
func (s *Server) ScriptPolicy(answers ...Answer) { s.Script("/policy", answers...) }

// RefuseHandshakes makes /ws answer status (e.g. 403, 503) instead of
// upgrading; 0 accepts again.
func (s *Server) RefuseHandshakes(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = status
}

// SetNotifyDelay delays each notify delivery by d, as if a slow consumer
// were ahead in the server's serial delivery (§2.5).
func (s *Server) SetNotifyDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyDelay = d
}

// Requests returns a copy of every request recorded so far, in order.
func (s *Server) Requests() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.records...)
}

// Subscribers returns how many sockets are subscribed to topic.
func (s *Server) Subscribers(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.subscribed(topic) {
			n++
		}
	}
	return n
}

// Rescan re-reads PolicyDir. When the hash changed it keeps the new snapshot
// (older ones stay known, for deltas) and publishes the §3.2 notification
// to policy:<dir> for every changed directory. It reports whether anything
// changed.
func (s *Server) Rescan() (bool, error) {
	if s.o.PolicyDir == "" {
		return false, nil
	}
	snap, err := readSnapshot(s.o.PolicyDir)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	old := s.cur
	if old.hash == snap.hash {
		s.mu.Unlock()
		return false, nil
	}
	if known := s.snaps[snap.hash]; known != nil {
		snap = known // reverted to an earlier state
	}
	s.snaps[snap.hash] = snap
	s.cur = snap
	s.mu.Unlock()
	msg := map[string]any{
		"old_policy_hash":     old.hash,
		"new_policy_hash":     snap.hash,
		"changed_directories": changedDirs(old, snap),
	}
	for _, d := range changedDirs(old, snap) {
		s.Publish([]string{"policy:" + d}, msg)
	}
	s.log.Info("policy changed", "old", old.hash, "new", snap.hash)
	return true, nil
}

func (s *Server) authorized(r *http.Request) bool {
	return s.o.Token == "" || r.Header.Get("Authorization") == "Bearer "+s.o.Token
}

// ServeHTTP records the request, applies a scripted answer if one is queued
// for its path, and otherwise serves it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rw := &recWriter{ResponseWriter: w, s: s, rec: Record{
		Time: s.o.Clock.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
	}}
	defer rw.finish()
	s.mu.Lock()
	var a *Answer
	if q := s.scripts[r.URL.Path]; len(q) > 0 {
		a = &q[0]
		s.scripts[r.URL.Path] = q[1:]
	}
	s.mu.Unlock()
	if a != nil && a.Status != 0 {
		s.scripted(rw, r, *a)
		return
	}
	s.mux.ServeHTTP(rw, r)
}

func (s *Server) scripted(w http.ResponseWriter, r *http.Request, a Answer) {
	for k, vs := range a.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	if a.Truncate {
		w.Header().Set("Content-Length", fmt.Sprint(len(a.Body)+1024))
	}
	w.WriteHeader(a.Status)
	_, _ = w.Write([]byte(a.Body))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	switch {
	case a.Truncate:
		panic(http.ErrAbortHandler) // net/http closes the connection mid-body
	case a.Stall:
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"detail":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json") // §9: the Python client insists
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func detail(msg string) map[string]string { return map[string]string{"detail": msg} }

// handlePolicy serves §4: full or delta bundle, 404 for an unknown path.
func (s *Server) handlePolicy(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	q := r.URL.Query()
	dirs := []string{"."}
	if r.PathValue("id") == "" && len(q["path"]) > 0 { // the scoped endpoint ignores path (§4.1)
		dirs = dirs[:0]
		for _, p := range q["path"] {
			dirs = append(dirs, normPath(p))
		}
	}
	s.mu.Lock()
	cur := s.cur
	base := s.snaps[q.Get("base_hash")] // unknown or absent: full bundle (§4.3)
	s.mu.Unlock()
	for _, d := range dirs {
		if !cur.dirs[d] {
			writeJSON(w, http.StatusNotFound, detail("path not found: "+d))
			return
		}
	}
	writeJSON(w, http.StatusOK, bundle(cur, base, dirs))
}

func (s *Server) handleDataConfig(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	if s.o.DataConfig != nil {
		writeJSON(w, http.StatusOK, s.o.DataConfig)
		return
	}
	if s.o.DataDir != "" {
		entries, err := s.dataDirEntries(r)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, detail("data dir: "+err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": []any{map[string]any{
		"url":         "http://" + r.Host + "/policy-data",
		"config":      nil,
		"topics":      []string{"policy_data"},
		"dst_path":    "",
		"save_method": "PUT",
		"data":        nil,
	}}})
}

func (s *Server) handlePolicyData(w http.ResponseWriter, _ *http.Request) {
	if s.o.PolicyData != nil {
		writeJSON(w, http.StatusOK, s.o.PolicyData)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

// recWriter records the status of a response the first time it is known.
type recWriter struct {
	http.ResponseWriter
	s    *Server
	rec  Record
	done bool
}

func (w *recWriter) record(status int) {
	if w.done {
		return
	}
	w.done = true
	w.rec.Status = status
	w.s.mu.Lock()
	w.s.records = append(w.s.records, w.rec)
	w.s.mu.Unlock()
}

func (w *recWriter) WriteHeader(status int) {
	w.record(status)
	w.ResponseWriter.WriteHeader(status)
}

func (w *recWriter) Write(b []byte) (int, error) {
	w.record(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

func (w *recWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController and the WebSocket upgrader reach the
// underlying writer (Hijack).
func (w *recWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recWriter) Hijack() (c net.Conn, b *bufio.ReadWriter, err error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("devserver: response writer cannot hijack")
	}
	c, b, err = h.Hijack()
	if err == nil {
		w.record(http.StatusSwitchingProtocols)
	}
	return c, b, err
}

func (w *recWriter) finish() {
	w.record(http.StatusOK)
}

// ensure the upgrader sees a Hijacker.
var _ http.Hijacker = (*recWriter)(nil)

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	refuse := s.refuse
	s.mu.Unlock()
	if refuse != 0 {
		writeJSON(w, refuse, detail("handshake refused"))
		return
	}
	if !s.authorized(r) {
		// The Python server closes before accepting: the handshake gets 403.
		writeJSON(w, http.StatusForbidden, detail("invalid token"))
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	ws.SetReadLimit(-1)
	c := newWSConn(s, ws)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ws.Close()
		return
	}
	s.conns[c] = true
	s.mu.Unlock()
	c.serve(r.Context())
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// DropAllSockets closes every WebSocket abruptly, as a server restart or a
// backbone recovery would (§2.7), and returns how many it closed.
func (s *Server) DropAllSockets() int {
	s.mu.Lock()
	cs := make([]*wsConn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.ws.Close()
	}
	return len(cs)
}

// Publish sends a notify with data to every socket subscribed to each of
// topics, one (subscriber, topic) at a time, each awaited (§2.5), and
// returns how many were answered.
func (s *Server) Publish(topics []string, data any) int {
	s.mu.Lock()
	cs := make([]*wsConn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	delay := s.notifyDelay
	s.mu.Unlock()
	n := 0
	for _, c := range cs {
		for _, t := range topics {
			if !c.subscribed(t) {
				continue
			}
			if delay > 0 {
				s.o.Clock.Sleep(delay)
			}
			if c.notify(t, data) == nil {
				n++
			}
		}
	}
	return n
}
