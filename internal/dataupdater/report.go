package dataupdater

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/opal-go/opal-client/internal/redact"
)

// callback is one report target: its URL and, from a [url, config] pair,
// the method and headers to send it with (as the Python client's
// HttpFetcherConfig; opal issue #166).
type callback struct {
	URL     string
	Method  string // "" is POST
	Headers map[string]string
}

// reportTargets are the callbacks of an update when reporting is on: the
// configured ones, then the update's own (a URL or a [url, config] pair).
func reportTargets(up *Update, o Options) []callback {
	if !o.Report {
		return nil
	}
	var out []callback
	for _, c := range o.Callbacks {
		out = append(out, callback{URL: c})
	}
	if up != nil {
		for _, raw := range up.Callback.Callbacks {
			var s string
			if json.Unmarshal(raw, &s) == nil && s != "" {
				out = append(out, callback{URL: s})
				continue
			}
			var pair []json.RawMessage
			if json.Unmarshal(raw, &pair) == nil && len(pair) > 0 && json.Unmarshal(pair[0], &s) == nil && s != "" {
				c := callback{URL: s}
				var cfg SourceConfig
				if len(pair) > 1 && json.Unmarshal(pair[1], &cfg) == nil {
					c.Method, c.Headers = strings.ToUpper(cfg.Method), cfg.Headers // guard: mutation "c.Method, c.Headers = "", nil" loses the callback's config
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// EntryReport is one entry's line of a Report.
type EntryReport struct {
	Entry   Entry  `json:"entry"`
	Fetched bool   `json:"fetched"`
	Saved   bool   `json:"saved"`
	Hash    string `json:"hash"`
	Error   string `json:"error,omitempty"`
}

// Report is the DataUpdateReport POSTed to the callbacks once every entry of
// an update has finished.
type Report struct {
	UpdateID string         `json:"update_id"`
	Reports  []EntryReport  `json:"reports"`
	UserData map[string]any `json:"user_data"`
}

// reporter collects the entries of one update; nil reports nothing.
type reporter struct {
	u       *Updater
	targets []callback
	mu      sync.Mutex
	pending int
	closed  bool
	rep     Report
}

func newReporter(u *Updater, id string, targets []callback) *reporter {
	return &reporter{u: u, targets: targets, rep: Report{UpdateID: id, Reports: []EntryReport{}, UserData: map[string]any{}}}
}

func (r *reporter) add() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.pending++
	r.mu.Unlock()
}

func (r *reporter) done(e Entry, body []byte, err error) {
	if r == nil {
		return
	}
	er := EntryReport{Entry: e, Fetched: true, Saved: err == nil}
	if body != nil {
		asText := e.Config != nil && e.Config.IsJSON != nil && !*e.Config.IsJSON && !e.Inline()
		er.Hash = ReportHash(body, asText)
	}
	if err != nil {
		er.Error = err.Error()
		var de *DecodeError
		var pe *PatchError
		var pp *ProtectedPathError
		// Fetched unless the fetch itself failed.
		er.Fetched = e.Inline() || errors.As(err, &de) || errors.As(err, &pe) || errors.As(err, &pp)
	}
	r.mu.Lock()
	r.rep.Reports = append(r.rep.Reports, er)
	r.pending--
	r.mu.Unlock()
	r.maybeSend()
}

func (r *reporter) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.maybeSend()
}

func (r *reporter) maybeSend() {
	r.mu.Lock()
	ready := r.closed && r.pending == 0
	if ready {
		r.closed = false // send once
	}
	r.mu.Unlock()
	if !ready {
		return
	}
	body, err := json.Marshal(r.rep)
	if err != nil {
		return
	}
	for _, t := range r.targets {
		r.u.spawn(func() { r.u.post(t, body) })
	}
}

// post sends one report, once, within the attempt timeout, with the
// callback's method (POST by default) and headers. The client token goes
// only to the host of the sources config (the OPAL server).
func (u *Updater) post(cb callback, body []byte) {
	target := cb.URL
	method := cb.Method
	if method == "" {
		method = http.MethodPost
	}
	ctx, cancel := context.WithCancel(u.ctx)
	defer cancel()
	t := u.clk.AfterFunc(u.o.AttemptTimeout, cancel)
	defer t.Stop()
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		u.log.Warn("data update report not sent", "callback", redact.URL(target), "error", redact.Error(err))
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if u.o.Token != "" && sameHost(target, u.o.SourcesURL) {
		req.Header.Set("Authorization", "Bearer "+u.o.Token)
	}
	for k, v := range cb.Headers {
		req.Header.Set(k, v)
	}
	client := u.o.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		u.log.Warn("data update report not sent", "callback", redact.URL(target), "error", redact.Error(err))
		return
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		u.log.Warn("data update report refused", "callback", redact.URL(target), "status", resp.StatusCode)
	}
}

func sameHost(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Host != "" && ua.Scheme == ub.Scheme && ua.Host == ub.Host
}
