package agent

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// fakeServer is a small OPAL server for the end-to-end tests (protocol §9):
// a policy repository in memory served as full or delta bundles, pub/sub
// with notifications, and fault injection (scripted /policy answers,
// dropped sockets, refused handshakes), recording every request. Its events
// channel receives one value per request, handshake and subscribe, so tests
// wait on events with a deadline instead of sleeping.
type fakeServer struct {
	t     *testing.T
	srv   *httptest.Server
	token string

	mu        sync.Mutex
	files     map[string]string
	snapshots map[string]map[string]string // hash -> files
	head      string
	script    []scripted // answered before any bundle
	requests  []*http.Request
	conns     []*wsConn
	subs      int
	shakes    int
	dropAfter bool // close every socket right after its subscribe

	events chan string
}

type scripted struct {
	status     int
	retryAfter string
}

type wsConn struct {
	mu sync.Mutex
	c  *websocket.Conn
}

func (w *wsConn) write(b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.WriteMessage(websocket.TextMessage, b)
}

func newFakeServer(t *testing.T, files map[string]string) *fakeServer {
	s := &fakeServer{t: t, token: "test-token", files: map[string]string{}, snapshots: map[string]map[string]string{},
		events: make(chan string, 1024)}
	for k, v := range files {
		s.files[k] = v
	}
	s.commitLocked()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /policy", s.policy)
	mux.HandleFunc("GET /ws", s.ws)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.close)
	return s
}

func (s *fakeServer) close() {
	s.mu.Lock()
	for _, c := range s.conns {
		c.c.Close()
	}
	s.mu.Unlock()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

func (s *fakeServer) event(e string) {
	select {
	case s.events <- e:
	default:
	}
}

// commitLocked makes the files the new head commit; the hash is the
// content's SHA-1 (40 hex, like a git commit).
func (s *fakeServer) commitLocked() string {
	keys := make([]string, 0, len(s.files))
	for k := range s.files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha1.New()
	snap := map[string]string{}
	for _, k := range keys {
		h.Write([]byte(k + "\x00" + s.files[k] + "\x00"))
		snap[k] = s.files[k]
	}
	old := s.head
	s.head = hex.EncodeToString(h.Sum(nil))
	s.snapshots[s.head] = snap
	return old
}

// update changes (or, with "", deletes) files, commits, and notifies every
// subscriber on policy:. as the OPAL server does (§3.2).
func (s *fakeServer) update(notify bool, changes map[string]string) {
	s.mu.Lock()
	dirs := map[string]bool{".": true}
	for k, v := range changes {
		if v == "" {
			delete(s.files, k)
		} else {
			s.files[k] = v
		}
		for d := path.Dir(k); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	old := s.commitLocked()
	head := s.head
	conns := append([]*wsConn(nil), s.conns...)
	s.mu.Unlock()
	if !notify {
		return
	}
	var changed []string
	for d := range dirs {
		changed = append(changed, d)
	}
	sort.Strings(changed)
	for _, c := range conns {
		frame, _, _ := pubsub.NewRequest("notify", map[string]any{
			"subscription": map[string]any{"id": "1", "subscriber_id": "2", "topic": "policy:.", "notifier_id": nil},
			"data":         map[string]any{"old_policy_hash": old, "new_policy_hash": head, "changed_directories": changed},
		})
		_ = c.write(frame)
	}
}

// notifyRaw sends one notify with arbitrary data on topic.
func (s *fakeServer) notifyRaw(topic string, data any) {
	s.mu.Lock()
	conns := append([]*wsConn(nil), s.conns...)
	s.mu.Unlock()
	for _, c := range conns {
		frame, _, _ := pubsub.NewRequest("notify", map[string]any{
			"subscription": map[string]any{"id": "1", "subscriber_id": "2", "topic": topic, "notifier_id": nil},
			"data":         data,
		})
		_ = c.write(frame)
	}
}

func (s *fakeServer) setScript(sc ...scripted) {
	s.mu.Lock()
	s.script = append(s.script, sc...)
	s.mu.Unlock()
}

func (s *fakeServer) policyRequests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.requests...)
}

func (s *fakeServer) counts() (subs, shakes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs, s.shakes
}

// dropAll closes every open socket.
func (s *fakeServer) dropAll() {
	s.mu.Lock()
	for _, c := range s.conns {
		c.c.Close()
	}
	s.conns = nil
	s.mu.Unlock()
}

func (s *fakeServer) authorized(r *http.Request) bool {
	return r.Header.Get("Authorization") == "Bearer "+s.token
}

var packageRe = regexp.MustCompile(`(?m)^package\s+([\w.]+)`)

func (s *fakeServer) policy(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	defer s.event("policy")
	if len(s.script) > 0 {
		sc := s.script[0]
		s.script = s.script[1:]
		s.mu.Unlock()
		if sc.retryAfter != "" {
			w.Header().Set("Retry-After", sc.retryAfter)
		}
		http.Error(w, `{"detail":"scripted"}`, sc.status)
		return
	}
	if !s.authorized(r) {
		s.mu.Unlock()
		http.Error(w, `{"detail":"bad token"}`, http.StatusUnauthorized)
		return
	}
	head := s.snapshots[s.head]
	b := fetcher.PolicyBundle{Hash: s.head, DataModules: []fetcher.DataModule{}, PolicyModules: []fetcher.PolicyModule{}, Manifest: []string{}}
	include := func(string) bool { return true }
	if base, ok := s.snapshots[r.URL.Query().Get("base_hash")]; ok {
		bh := r.URL.Query().Get("base_hash")
		b.OldHash = &bh
		include = func(k string) bool { v, had := base[k]; return !had || v != head[k] }
		for k := range base {
			if _, still := head[k]; still {
				continue
			}
			if b.DeletedFiles == nil {
				b.DeletedFiles = &fetcher.DeletedFiles{DataModules: []string{}, PolicyModules: []string{}}
			}
			if path.Base(k) == "data.json" {
				b.DeletedFiles.DataModules = append(b.DeletedFiles.DataModules, path.Dir(k))
			} else {
				b.DeletedFiles.PolicyModules = append(b.DeletedFiles.PolicyModules, k)
			}
		}
	}
	keys := make([]string, 0, len(head))
	for k := range head {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !include(k) {
			continue
		}
		b.Manifest = append(b.Manifest, k)
		switch {
		case path.Base(k) == "data.json":
			b.DataModules = append(b.DataModules, fetcher.DataModule{Path: path.Dir(k), Data: head[k]})
		case strings.HasSuffix(k, ".rego"):
			pkg := ""
			if m := packageRe.FindStringSubmatch(head[k]); m != nil {
				pkg = m[1]
			}
			b.PolicyModules = append(b.PolicyModules, fetcher.PolicyModule{Path: k, PackageName: pkg, Rego: head[k]})
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(b)
}

var upgrader = websocket.Upgrader{}

func (s *fakeServer) ws(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.shakes++
	s.mu.Unlock()
	s.event("handshake")
	if !s.authorized(r) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	wc := &wsConn{c: c}
	defer c.Close()
	for {
		_, data, err := c.ReadMessage()
		if err != nil {
			return
		}
		var m pubsub.Message
		if json.Unmarshal(data, &m) != nil || m.Request == nil {
			continue // answers to our notifies
		}
		var resp []byte
		switch m.Request.Method {
		case "_ping_":
			resp, _ = pubsub.NewResponse(m.Request.CallID, "pong", "str")
		case "subscribe":
			resp, _ = pubsub.NewResponse(m.Request.CallID, true, "bool")
		default:
			resp, _ = pubsub.NewResponse(m.Request.CallID, "None", "str")
		}
		if err := wc.write(resp); err != nil {
			return
		}
		if m.Request.Method == "subscribe" {
			s.mu.Lock()
			s.subs++
			drop := s.dropAfter
			if !drop {
				s.conns = append(s.conns, wc)
			}
			s.mu.Unlock()
			s.event("subscribe")
			if drop {
				return
			}
		}
	}
}
