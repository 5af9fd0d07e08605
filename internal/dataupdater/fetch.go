// This file produces an entry's write: inline data, or its source fetched
// with the fetcher's classified retry (F1-F8), bounded as a whole by
// OPAL_FETCHING_CALLBACK_TIMEOUT; the OPAL token never goes to a source.

package dataupdater

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/opal-go/opal-client/fetcher"
)

// ErrFetchTimeout ends a fetch that ran past OPAL_FETCHING_CALLBACK_TIMEOUT;
// it is wrapped in an exhausted *fetcher.RetryableError.
var ErrFetchTimeout = errors.New("fetch exceeded OPAL_FETCHING_CALLBACK_TIMEOUT")

// prepare checks the entry and produces its write (inline data, or the
// source's answer) and the bytes the report's hash is computed from.
func (u *Updater) prepare(ctx context.Context, e Entry) (Write, []byte, error) {
	w := Write{Path: e.Path(), Method: e.Method(), SplitRoot: u.o.SplitRootData}
	if err := e.Validate(); err != nil {
		return w, nil, err
	}
	body := []byte(e.Data)
	if !e.Inline() {
		var err error
		if body, err = u.fetchSource(ctx, e); err != nil {
			return w, nil, err
		}
	}
	if w.Method == MethodPatch {
		ops, err := DecodePatch(body)
		w.Patch = ops
		return w, body, err
	}
	if e.Config != nil && e.Config.IsJSON != nil && !*e.Config.IsJSON && !e.Inline() {
		w.Value = string(body)
		return w, body, nil
	}
	v, err := decodeValue(body)
	if err != nil {
		return w, nil, &DecodeError{What: "data", Err: err}
	}
	w.Value = v
	return w, body, nil
}

// fetchSource fetches an entry's URL with only its own headers: the OPAL
// token is never sent to a data source.
func (u *Updater) fetchSource(ctx context.Context, e Entry) ([]byte, error) {
	method := http.MethodGet
	var headers map[string]string
	var reqBody []byte
	asJSON := true
	if c := e.Config; c != nil {
		if c.Method != "" {
			method = strings.ToUpper(c.Method)
		}
		headers = c.Headers
		if d := bytes.TrimSpace(c.Data); len(d) > 0 && !bytes.Equal(d, []byte("null")) {
			reqBody = d
		}
		asJSON = c.IsJSON == nil || *c.IsJSON
	}
	var body []byte
	_, err := u.fetchBounded(ctx, func(ctx context.Context) (*http.Request, error) {
		var rd *bytes.Reader
		if reqBody != nil {
			rd = bytes.NewReader(reqBody)
		}
		var req *http.Request
		var err error
		if rd != nil {
			req, err = http.NewRequestWithContext(ctx, method, e.URL, rd)
		} else {
			req, err = http.NewRequestWithContext(ctx, method, e.URL, nil)
		}
		if err != nil {
			return nil, err
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		if reqBody != nil && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, nil
	}, func(b []byte) error {
		// A body that does not decode may be a truncated transfer: retry
		// (F1). PATCH bodies are checked after the fetch.
		if asJSON && !json.Valid(b) {
			return errors.New("body is not JSON")
		}
		body = b
		return nil
	})
	return body, err
}

// fetchBounded runs one classified fetch bounded as a whole by FetchTimeout
// on the injected clock; running past it ends the fetch exhausted, with the
// last Retry-After hint, so the entry's deferral arms.
func (u *Updater) fetchBounded(ctx context.Context, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (*fetcher.Result, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := u.clk.AfterFunc(u.o.FetchTimeout, func() { cancel(ErrFetchTimeout) })
	defer t.Stop()
	res, err := u.f.Do(fctx, newRequest, decode)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(fctx), ErrFetchTimeout) {
		u.log.Warn("data fetch abandoned", "bound", u.o.FetchTimeout, "attempts", res.Attempts)
		return res, &fetcher.RetryableError{Status: res.LastStatus, Exhausted: true, Message: "no usable answer in time", Err: ErrFetchTimeout}
	}
	return res, err
}
