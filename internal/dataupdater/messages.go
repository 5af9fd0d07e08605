package dataupdater

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// DefaultTopic is the topic of an entry that names none (protocol §6.2).
const DefaultTopic = "policy_data"

// Save methods of an Entry.
const (
	MethodPut   = "PUT"
	MethodPatch = "PATCH"
)

// Update is a DataUpdate message (protocol §6.2): the data of a notify on a
// data topic.
type Update struct {
	ID       string  `json:"id"` // "" when the server sent null; a random id is used then
	Reason   string  `json:"reason"`
	Entries  []Entry `json:"entries"`
	Callback struct {
		Callbacks []json.RawMessage `json:"callbacks"`
	} `json:"callback"`
}

// Entry is one data source entry of an Update or of /data/config.
type Entry struct {
	URL        string          `json:"url"`
	Config     *SourceConfig   `json:"config"`
	Topics     []string        `json:"topics"`      // nil means [DefaultTopic]
	DstPath    string          `json:"dst_path"`    // "" or "/" is the root
	SaveMethod string          `json:"save_method"` // PUT (default) or PATCH
	Data       json.RawMessage `json:"data"`        // inline payload; null means fetch URL
	// PeriodicUpdateInterval (seconds) is set only in /data/config entries:
	// the entry is fetched again every so often.
	PeriodicUpdateInterval *float64 `json:"periodic_update_interval"`
}

// SourceConfig is the fetcher config of an entry (protocol §6.4). Only
// Headers are sent to the source: never the OPAL client token.
type SourceConfig struct {
	Headers map[string]string `json:"headers"`
	IsJSON  *bool             `json:"is_json"` // false stores the body as a JSON string
	Method  string            `json:"method"`  // get (default), post, put, patch, head, delete
	Data    json.RawMessage   `json:"data"`    // request body, sent as JSON
	// Fetcher names the Python client's fetch provider; only the HTTP one
	// (HTTPFetchProvider, the default) exists here.
	Fetcher string `json:"fetcher"`
}

// HTTPFetchProvider is the fetch provider of an entry whose config names
// none: the only one this client has.
const HTTPFetchProvider = "HttpFetchProvider"

// DecodeError is a message, source config or payload that is not what the
// protocol says: the entry (or message) is refused, nothing is written.
type DecodeError struct {
	What string
	Err  error
}

func (e *DecodeError) Error() string { return "data update: invalid " + e.What + ": " + e.Err.Error() }

func (e *DecodeError) Unwrap() error { return e.Err }

// DecodeUpdate decodes a DataUpdate and checks each entry (Validate).
func DecodeUpdate(b []byte) (*Update, error) {
	var u Update
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, &DecodeError{What: "data update message", Err: err}
	}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return nil, &DecodeError{What: "data update message", Err: fmt.Errorf("null")}
	}
	return &u, nil
}

// DecodeSources decodes the body of OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL:
// {"entries": [...]}.
func DecodeSources(b []byte) ([]Entry, error) {
	var c struct {
		Entries *[]Entry `json:"entries"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, &DecodeError{What: "data sources config", Err: err}
	}
	if c.Entries == nil {
		return nil, &DecodeError{What: "data sources config", Err: fmt.Errorf(`no "entries"`)}
	}
	return *c.Entries, nil
}

// Method is the entry's save method, upper-cased, PUT by default.
func (e *Entry) Method() string {
	if e.SaveMethod == "" {
		return MethodPut
	}
	return strings.ToUpper(e.SaveMethod)
}

// Inline reports whether the entry carries its data (no fetch).
func (e *Entry) Inline() bool {
	d := bytes.TrimSpace(e.Data)
	return len(d) > 0 && !bytes.Equal(d, []byte("null"))
}

// Path is the entry's dst_path as segments; the root is empty.
func (e *Entry) Path() []string { return SplitPath(e.DstPath) }

// Validate checks what can be checked before fetching: a known save method,
// a URL when there is no inline data, and a JSON-Patch for an inline PATCH.
func (e *Entry) Validate() error {
	switch e.Method() {
	case MethodPut, MethodPatch:
	default:
		return &DecodeError{What: "entry", Err: fmt.Errorf("save_method %q is neither PUT nor PATCH", e.SaveMethod)}
	}
	if p := e.PeriodicUpdateInterval; p != nil && !(*p >= 0 && !math.IsInf(*p, 1)) {
		return &DecodeError{What: "entry", Err: fmt.Errorf("periodic_update_interval %v is not a non-negative number of seconds", *p)}
	}
	if !e.Inline() && e.URL == "" {
		return &DecodeError{What: "entry", Err: fmt.Errorf("no url and no data")}
	}
	if c := e.Config; c != nil && c.Fetcher != "" && c.Fetcher != HTTPFetchProvider && !e.Inline() {
		// Retrying would never help: refused at once (guard: TestEntryRefusedAtOnce/non_http_fetcher).
		return &DecodeError{What: "entry", Err: fmt.Errorf("config.fetcher %q is not supported: only %s fetches data here", c.Fetcher, HTTPFetchProvider)}
	}
	if strings.ContainsRune(e.DstPath, 0) {
		return &DecodeError{What: "entry", Err: fmt.Errorf("dst_path holds a NUL byte")}
	}
	for _, s := range e.Path() {
		if s == ".." || s == "." {
			return &DecodeError{What: "entry", Err: fmt.Errorf("dst_path %q has a %q segment", e.DstPath, s)}
		}
	}
	if e.Inline() && e.Method() == MethodPatch {
		if _, err := DecodePatch(e.Data); err != nil {
			return err
		}
	}
	return nil
}

// matches reports whether one of the entry's topics is subscribed, exactly
// (protocol §6.2).
func (e *Entry) matches(subscribed []string) bool {
	topics := e.Topics
	if topics == nil {
		topics = []string{DefaultTopic}
	}
	for _, t := range topics {
		for _, s := range subscribed {
			if t == s {
				return true
			}
		}
	}
	return false
}

// SplitPath splits a data path ("", "/", "/a/b", "a/b") into segments.
func SplitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// NotifyTopic is the topic a notify is dispatched under: a topic holding
// "::" is replaced by its second "::"-separated segment (a tenant prefix,
// protocol §6.1).
func NotifyTopic(t string) string {
	if parts := strings.Split(t, "::"); len(parts) > 1 {
		return parts[1]
	}
	return t
}

// decodeValue decodes JSON keeping numbers exact (json.Number), as OPA's
// storage expects.
func decodeValue(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}
