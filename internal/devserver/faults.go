package devserver

import (
	"encoding/json"
	"net/http"
	"strings"
)

// The fault routes let a person try the client's outage behaviour by hand
// against a running dev server, as the tests do through the Server's
// methods: drop every socket (a restart), script the answers of a route,
// read the request log.

// maxScripted bounds one script request's answers, so a typo cannot make
// the server hold millions of them.
const maxScripted = 100000

func (s *Server) handleAdminDropSockets(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"dropped": s.DropAllSockets()})
}

// scriptedAnswer is one Answer of POST /admin/script, repeated Count times
// (default 1).
type scriptedAnswer struct {
	Status   int               `json:"status"`
	Headers  map[string]string `json:"headers"`
	Body     string            `json:"body"`
	Stall    bool              `json:"stall"`
	Truncate bool              `json:"truncate"`
	Count    int               `json:"count"`
}

func (s *Server) handleAdminScript(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	var req struct {
		Path    string           `json:"path"`
		Answers []scriptedAnswer `json:"answers"`
	}
	const want = `want {"path":"/policy","answers":[{"status":503,"headers":{"Retry-After":"8"},"body":"...","stall":false,"count":1}]}`
	// The admin routes themselves cannot be scripted: a script is served
	// before a route's token check, so it could lock the admin API out.
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody)).Decode(&req); err != nil ||
		!strings.HasPrefix(req.Path, "/") || strings.HasPrefix(req.Path, "/admin/") || len(req.Answers) == 0 {
		writeJSON(w, http.StatusBadRequest, detail(want))
		return
	}
	var out []Answer
	for _, a := range req.Answers {
		// Compared without adding, so a huge count cannot overflow past the bound.
		if a.Status < 100 || a.Status > 999 || a.Count < 0 || max(a.Count, 1) > maxScripted-len(out) {
			writeJSON(w, http.StatusBadRequest, detail(want))
			return
		}
		h := http.Header{}
		for k, v := range a.Headers {
			h.Set(k, v)
		}
		for range max(a.Count, 1) {
			out = append(out, Answer{Status: a.Status, Header: h, Body: a.Body, Stall: a.Stall, Truncate: a.Truncate})
		}
	}
	s.Script(req.Path, out...)
	writeJSON(w, http.StatusOK, map[string]any{"path": req.Path, "queued": len(out)})
}

func (s *Server) handleAdminRequests(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	writeJSON(w, http.StatusOK, s.Requests())
}
