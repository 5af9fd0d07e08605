package devserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
)

// DataSourcesPrefix is the route under which the files of Options.DataDir
// are served: DataDir/a/b.json is GET /data-sources/a/b.json.
const DataSourcesPrefix = "/data-sources/"

// defaultDataTopic is the topic of an entry that names none (§6.2).
const defaultDataTopic = "policy_data"

// maxAdminBody bounds an admin request body.
const maxAdminBody = 8 << 20

// handleDataSource serves one JSON file of DataDir, read on every request so
// an edit shows at once. Data sources are open: the client never sends its
// OPAL token to them (§6.4). Script(DataSourcesPrefix+"a.json", ...) injects
// faults here like anywhere else.
func (s *Server) handleDataSource(w http.ResponseWriter, r *http.Request) {
	rel := r.PathValue("file")
	if s.o.DataDir == "" || !strings.HasSuffix(rel, ".json") || !fs.ValidPath(rel) {
		writeJSON(w, http.StatusNotFound, detail("no such data source"))
		return
	}
	root, err := os.OpenRoot(s.o.DataDir) // confines rel to DataDir (no "..", no symlink escape)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, detail("data dir: "+err.Error()))
		return
	}
	defer root.Close()
	b, err := root.ReadFile(rel)
	if err != nil {
		writeJSON(w, http.StatusNotFound, detail("no such data source"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// dataDirEntries lists DataDir's *.json files as /data/config entries: each
// is PUT at its path without ".json" (a/b.json -> /a/b), topic policy_data.
func (s *Server) dataDirEntries(r *http.Request) ([]map[string]any, error) {
	base := "http://" + r.Host
	if r.TLS != nil { // served over TLS: the sources are too
		base = "https://" + r.Host
	}
	var files []string
	err := fs.WalkDir(os.DirFS(s.o.DataDir), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	entries := make([]map[string]any, 0, len(files))
	for _, f := range files {
		entries = append(entries, map[string]any{
			"url":         base + DataSourcesPrefix + f,
			"config":      nil,
			"topics":      []string{defaultDataTopic},
			"dst_path":    "/" + strings.TrimSuffix(f, ".json"),
			"save_method": "PUT",
			"data":        nil,
		})
	}
	return entries, nil
}

// ExpandTopic returns a hierarchical data topic and its prefixes, shortest
// first, as the OPAL server publishes it (§6.1): "policy_data/users/keys" is
// policy_data, policy_data/users and policy_data/users/keys.
func ExpandTopic(t string) []string {
	parts := strings.Split(t, "/")
	out := make([]string, 0, len(parts))
	for i := range parts {
		out = append(out, strings.Join(parts[:i+1], "/"))
	}
	return out
}

// PublishDataUpdate publishes a DataUpdate (§6.2) as the OPAL server does
// (§6.1): each entry's topics (policy_data when it names none) are expanded
// to their prefixes and written back into the entry, and the update is
// published to the union of them. It returns the topics and how many
// notifies were answered. update must be a JSON object with an "entries"
// array of objects; the entries are not otherwise checked, so a test can
// send a client bad data on purpose.
func (s *Server) PublishDataUpdate(update []byte) (topics []string, delivered int, err error) {
	dec := json.NewDecoder(bytes.NewReader(update))
	dec.UseNumber() // pass numbers through unchanged
	var up map[string]any
	if err := dec.Decode(&up); err != nil {
		return nil, 0, errors.New("the update is not a JSON object: " + err.Error())
	}
	if dec.Decode(new(any)) != io.EOF {
		return nil, 0, errors.New("trailing data after the update")
	}
	entries, ok := up["entries"].([]any)
	if !ok {
		return nil, 0, errors.New(`the update has no "entries" array`)
	}
	seen := map[string]bool{}
	for i, e := range entries {
		entry, ok := e.(map[string]any)
		if !ok {
			return nil, 0, errors.New("entry " + strconv.Itoa(i) + " is not an object")
		}
		var mine []string
		switch ts := entry["topics"].(type) {
		case nil:
			mine = []string{defaultDataTopic}
		case []any:
			for _, t := range ts {
				str, ok := t.(string)
				if !ok || str == "" {
					return nil, 0, errors.New("entry " + strconv.Itoa(i) + ": topics must be non-empty strings")
				}
				mine = append(mine, str)
			}
		default:
			return nil, 0, errors.New("entry " + strconv.Itoa(i) + ": topics must be an array")
		}
		var expanded []string
		own := map[string]bool{}
		for _, t := range mine {
			for _, x := range ExpandTopic(t) {
				if !own[x] {
					own[x] = true
					expanded = append(expanded, x)
				}
				if !seen[x] {
					seen[x] = true
					topics = append(topics, x)
				}
			}
		}
		entry["topics"] = expanded
	}
	body, err := json.Marshal(up)
	if err != nil {
		return nil, 0, err
	}
	return topics, s.Publish(topics, json.RawMessage(body)), nil
}

// handleAdminDataUpdate is POST /admin/data-update: a DataUpdate body,
// published to its entries' topics (PublishDataUpdate). It answers once every
// subscriber has answered its notify.
func (s *Server) handleAdminDataUpdate(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) { // guard: mutation "if false {" lets anyone publish data
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, detail("reading the body: "+err.Error()))
		return
	}
	topics, n, err := s.PublishDataUpdate(b)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, detail(err.Error()))
		return
	}
	s.log.Info("data update published", "topics", topics, "delivered", n)
	writeJSON(w, http.StatusOK, map[string]any{"topics": topics, "delivered": n})
}

// handleAdminPublish is POST /admin/publish: {"topics":[...],"data":...}
// published verbatim, one notify per subscribed (socket, topic).
func (s *Server) handleAdminPublish(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, detail("invalid token"))
		return
	}
	var req struct {
		Topics []string        `json:"topics"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody)).Decode(&req); err != nil || len(req.Topics) == 0 {
		writeJSON(w, http.StatusBadRequest, detail(`want {"topics":[...],"data":...}`))
		return
	}
	data := req.Data
	if data == nil {
		data = json.RawMessage("null")
	}
	n := s.Publish(req.Topics, data)
	writeJSON(w, http.StatusOK, map[string]any{"topics": req.Topics, "delivered": n})
}
