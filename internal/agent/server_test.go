package agent

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/opal-go/opal-client/internal/devserver"
)

// testServer is the dev OPAL server (internal/devserver) on a loopback
// listener, serving a temporary policy directory. Its events channel
// receives "policy" when a /policy request arrives and "handshake" when a
// /ws request does, so tests wait on events with a deadline, never sleep.
type testServer struct {
	t      *testing.T
	dev    *devserver.Server
	srv    *httptest.Server
	dir    string
	token  string
	files  map[string]string
	events chan string
}

func newTestServer(t *testing.T, files map[string]string) *testServer {
	s := &testServer{t: t, dir: t.TempDir(), token: "test-token", files: map[string]string{}, events: make(chan string, 1024)}
	s.write(files)
	s.dev = devserver.New(devserver.Options{PolicyDir: s.dir, Token: s.token})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/policy":
			s.event("policy")
		case "/ws":
			s.event("handshake")
		}
		s.dev.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		s.dev.Close()
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return s
}

func (s *testServer) event(e string) {
	select {
	case s.events <- e:
	default:
	}
}

func (s *testServer) write(changes map[string]string) {
	for k, v := range changes {
		p := filepath.Join(s.dir, filepath.FromSlash(k))
		if v == "" {
			delete(s.files, k)
			if err := os.Remove(p); err != nil {
				s.t.Fatal(err)
			}
			continue
		}
		s.files[k] = v
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
}

// update changes (or, with "", deletes) files and rescans, which publishes
// the §3.2 notification to the subscribers.
func (s *testServer) update(changes map[string]string) {
	s.write(changes)
	if changed, err := s.dev.Rescan(); err != nil || !changed {
		s.t.Fatalf("rescan: changed %v, err %v", changed, err)
	}
}

// updateUnseen changes files while no socket is connected: handshakes are
// refused and sockets dropped first, so no notification reaches the agent.
// The agent reconnects once the caller calls s.dev.RefuseHandshakes(0).
func (s *testServer) updateUnseen(changes map[string]string) {
	s.dev.RefuseHandshakes(http.StatusServiceUnavailable)
	s.dev.DropAllSockets()
	s.update(changes)
}

func (s *testServer) head() string { return s.dev.Hash() }

func (s *testServer) setScript(answers ...devserver.Answer) { s.dev.ScriptPolicy(answers...) }

func retryAfter(status int, after string) devserver.Answer {
	a := devserver.Answer{Status: status, Body: `{"detail":"scripted"}`}
	if after != "" {
		a.Header = http.Header{"Retry-After": {after}}
	}
	return a
}

// policyRequests are the /policy requests' queries, in order.
func (s *testServer) policyRequests() []url.Values {
	var out []url.Values
	for _, r := range s.dev.Requests() {
		if r.Path == "/policy" {
			q, _ := url.ParseQuery(r.Query)
			out = append(out, q)
		}
	}
	return out
}

// accepted counts the WebSocket handshakes the server accepted.
func (s *testServer) accepted() int {
	n := 0
	for _, r := range s.dev.Requests() {
		if r.Path == "/ws" && r.Status == http.StatusSwitchingProtocols {
			n++
		}
	}
	return n
}
