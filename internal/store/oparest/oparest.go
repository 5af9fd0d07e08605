// Package oparest is the external policy store: an OPA driven through its
// REST API (OPAL_INLINE_OPA_ENABLED=false), with the calls and policy ids of
// the Python client (opal-protocol §5.1), so an OPA it managed sees the same ids.
//
// A remote OPA has no multi-call transaction, so the store does what it can:
// the complete resulting module set is parsed and compiled locally first, so a
// bundle that does not compile (or has bad data JSON) never touches the
// remote. If a write then fails half-way, the error says so
// (*PartialWriteError) and the store forgets its hash; the error is transient,
// so the update queue re-arms the deferred re-fetch, whose full bundle repairs
// the remote without waiting for a notification. An OPA that is unreachable
// or answers 5xx fails transiently too: an OPA that starts after the agent is
// waited for under the deferral's backoff.
package oparest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/backoff"
	"github.com/opal-go/opal-client/internal/redact"
	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/updater"
)

// Options configure the REST store.
type Options struct {
	// URL is OPAL_POLICY_STORE_URL, e.g. "http://localhost:8181" (/v1 is appended).
	URL string
	// AuthToken is sent as "Authorization: Bearer" when not empty
	// (OPAL_POLICY_STORE_AUTH_TYPE=token). It is never logged.
	AuthToken string
	// HTTPClient defaults to a client with a 10 s timeout per request.
	HTTPClient *http.Client
	// Attempts is the number of tries of one write (OPAL_POLICY_STORE_CONN_RETRY
	// attempts); < 1 means 2.
	Attempts int
	// Wait is the pause after the n-th failed try (n >= 1); nil = 2 s fixed,
	// the Python default. The daemon passes ConnRetryOptions.Wait.
	Wait func(n int) time.Duration
	// Clock times the waits; nil = the real clock.
	Clock clock.Clock
	// PolicyPathsToIgnore are OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE.
	PolicyPathsToIgnore []string
	// Logger receives the store's logs; nil = slog.Default().
	Logger *slog.Logger
	// V0Compatible pre-compiles as the remote runs under --v0-compatible
	// (OPAL_OPA_V0_COMPAT): modules without a Rego version are v0.
	V0Compatible bool
	// TLSClientCert and TLSClientKey (PEM files) authenticate the agent to
	// OPA (mTLS); TLSCA (PEM file) is the CA that signs OPA's certificate.
	// OPAL_POLICY_STORE_TLS_CLIENT_CERT, _KEY and _CA. They configure the
	// default client only: with HTTPClient set they are refused.
	TLSClientCert, TLSClientKey, TLSCA string
}

// TLSError is a client TLS file that cannot be used.
type TLSError struct {
	File string
	Err  error
}

func (e *TLSError) Error() string { return fmt.Sprintf("oparest: TLS file %s: %v", e.File, e.Err) }

func (e *TLSError) Unwrap() error { return e.Err }

// RemoteError is an answer of the remote OPA outside the accepted statuses,
// or a transport error (Status 0).
type RemoteError struct {
	Method, Path string
	Status       int
	Body         string
	Err          error
}

func (e *RemoteError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("opa %s %s: %v", e.Method, e.Path, e.Err)
	}
	return fmt.Sprintf("opa %s %s: status %d: %s", e.Method, e.Path, e.Status, e.Body)
}

func (e *RemoteError) Unwrap() error { return e.Err }

// Transient reports whether a later try may succeed: OPA unreachable (not up
// yet, a refused or dropped connection) or a 5xx. The update queue then
// re-arms the deferred re-fetch (updater.IsTransient).
func (e *RemoteError) Transient() bool { return e.Status == 0 || e.Status >= 500 }

// PartialWriteError is a bundle whose writes failed after at least one
// succeeded: the remote holds part of it. The store's hash is cleared, so
// the next update fetches a full bundle.
type PartialWriteError struct {
	Writes int // writes that succeeded before the failure
	Err    error
}

func (e *PartialWriteError) Error() string {
	return fmt.Sprintf("opa write failed after %d successful writes; OPA holds part of it (the next policy update is a full bundle): %v", e.Writes, e.Err)
}

func (e *PartialWriteError) Unwrap() error { return e.Err }

// Transient is true: the remote holds part of the write, and a later full
// write repairs it.
func (e *PartialWriteError) Transient() bool { return true }

// PartialWrite is true: the store is not as it was (updater.IsPartial).
func (e *PartialWriteError) PartialWrite() bool { return true }

// Store is an OPA over REST. Writes are serialised.
type Store struct {
	base     string
	token    string
	client   *http.Client
	attempts int
	wait     func(int) time.Duration
	clock    clock.Clock
	log      *slog.Logger

	mu     sync.Mutex
	ignore *store.Ignore
	parser store.Parser
	hash   string
	owned  store.Ownership
}

var _ updater.Store = (*Store)(nil)

// New returns a store for the OPA at opts.URL. It does not contact OPA.
func New(opts Options) (*Store, error) {
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("oparest: bad policy store URL %q", redact.URL(opts.URL))
	}
	s := &Store{
		base:     strings.TrimSuffix(opts.URL, "/"),
		token:    opts.AuthToken,
		client:   opts.HTTPClient,
		attempts: opts.Attempts,
		wait:     opts.Wait,
		clock:    opts.Clock,
		log:      opts.Logger,
		ignore:   store.NewIgnore(opts.PolicyPathsToIgnore),
		owned:    store.Ownership{},
	}
	if s.client == nil {
		tc, err := tlsConfig(opts)
		if err != nil {
			return nil, err
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tc
		s.client = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	} else if opts.TLSClientCert != "" || opts.TLSCA != "" {
		return nil, errors.New("oparest: TLS files and a custom HTTPClient are exclusive")
	}
	if opts.V0Compatible {
		s.parser.Options.RegoVersion = ast.RegoV0
	}
	if s.attempts < 1 {
		s.attempts = 2
	}
	if s.wait == nil {
		s.wait = func(int) time.Duration { return 2 * time.Second }
	}
	if s.clock == nil {
		s.clock = clock.New()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s, nil
}

// tlsConfig is the client TLS of the policy store options; nil when none
// is set.
func tlsConfig(o Options) (*tls.Config, error) {
	if o.TLSClientCert == "" && o.TLSClientKey == "" && o.TLSCA == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLSClientCert != "" || o.TLSClientKey != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSClientCert, o.TLSClientKey)
		if err != nil {
			return nil, &TLSError{File: o.TLSClientCert, Err: err}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, &TLSError{File: o.TLSCA, Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &TLSError{File: o.TLSCA, Err: errors.New("no PEM certificate")}
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// PolicyHash returns the hash of the bundle last applied completely ("" if
// none, or after a half-way failure).
func (s *Store) PolicyHash(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hash, nil
}

// Health is OPA's GET /health (one try).
func (s *Store) Health(ctx context.Context) error {
	_, _, err := s.once(ctx, "GET", "/health", "", nil, http.StatusOK)
	return err
}

// SetHealthPolicy PUTs the system.opal health policy at store.HealthPolicyID.
func (s *Store) SetHealthPolicy(ctx context.Context, rego string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.do(ctx, "PUT", policyURL(store.HealthPolicyID), "text/plain", []byte(rego), http.StatusOK)
	return err
}

// ApplyPolicy applies a full or delta bundle in the order of §5.2: the data
// (stale paths deleted first), then the policies with the postponed retry
// (a module may need one uploaded after it), then the deletions. A delta on
// another base is refused with *updater.BaseMismatchError; a bundle that
// does not compile (*store.CompileError) or has bad data JSON
// (*store.DataError) is refused before any write.
func (s *Store) ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error {
	if b == nil {
		return errors.New("oparest: nil bundle")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := store.CheckBase(s.hash, b); err != nil {
		return err
	}
	current, err := s.modules(ctx)
	if err != nil {
		return err
	}
	plan, err := store.NewPlan(b, current, s.owned, s.ignore)
	if err != nil {
		return err
	}
	result, err := s.parser.Result(plan, current)
	if err != nil {
		return err
	}
	// The bundle's own data is checked against its rules here (U3); the
	// remote's other data only by the remote.
	if _, err := store.CompileWith(result, plan.DataConflicts(), store.CompileOptions{RegoVersion: s.parser.Options.RegoVersion}); err != nil {
		return err
	}
	// Before any write: the kept values are fetched as they are now.
	if err := plan.Compose(func(p []string) (any, bool, error) { return s.readData(ctx, p) }); err != nil {
		return err
	}
	writes, err := s.write(ctx, plan)
	if err != nil {
		if writes == 0 {
			return err // the remote is as it was
		}
		// The remote is part old, part new: never build a delta on it.
		s.hash = ""
		for k, v := range plan.Owned {
			s.owned[k] = v
		}
		return &PartialWriteError{Writes: writes, Err: err}
	}
	s.hash = b.Hash
	s.owned = plan.Owned
	s.parser.Forget(func(id string) bool { _, ok := result[id]; return ok })
	s.log.Debug("policy bundle applied", "hash", b.Hash, "delta", b.IsDelta(),
		"upserts", len(plan.Upserts), "deletes", len(plan.Deletes), "data_writes", len(plan.DataWrites))
	return nil
}

// write performs the plan; it returns how many writes succeeded.
func (s *Store) write(ctx context.Context, p *store.Plan) (int, error) {
	n := 0
	for _, d := range p.DataDeletes {
		if _, err := s.do(ctx, "DELETE", dataURL(d), "", nil, http.StatusNoContent, http.StatusNotFound); err != nil {
			return n, err
		}
		n++
	}
	for _, w := range p.DataWrites {
		body, err := json.Marshal(w.Value)
		if err != nil {
			return n, err
		}
		if _, err := s.do(ctx, "PUT", dataURL(w.Path), "application/json", body, http.StatusNoContent, http.StatusNotModified); err != nil {
			return n, err
		}
		n++
	}
	// Postponed retry (§5.2): the remote compiles each call against what it
	// holds, so a module can fail (400) until another one arrives or leaves.
	// Rounds go on while some call succeeds.
	type op struct {
		method, id string
		body       []byte
	}
	var pending []op
	for _, m := range p.Upserts {
		pending = append(pending, op{"PUT", m.Path, []byte(m.Rego)})
	}
	for _, id := range p.Deletes {
		pending = append(pending, op{"DELETE", id, nil})
	}
	for len(pending) > 0 {
		var again []op
		var last error
		for _, o := range pending {
			ok := []int{http.StatusOK}
			ctype := "text/plain"
			if o.method == "DELETE" {
				ok, ctype = []int{http.StatusOK, http.StatusNotFound}, ""
			}
			_, err := s.do(ctx, o.method, policyURL(o.id), ctype, o.body, ok...)
			var re *RemoteError
			if errors.As(err, &re) && re.Status == http.StatusBadRequest {
				again, last = append(again, o), err
				continue
			}
			if err != nil {
				return n, err
			}
			n++
		}
		if len(again) == len(pending) {
			return n, last
		}
		pending = again
	}
	return n, nil
}

// modules lists and parses the remote's modules.
func (s *Store) modules(ctx context.Context) (map[string]*ast.Module, error) {
	body, err := s.do(ctx, "GET", "/v1/policies", "", nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var list struct {
		Result []struct {
			ID  string `json:"id"`
			Raw string `json:"raw"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, &RemoteError{Method: "GET", Path: "/v1/policies", Status: http.StatusOK, Body: "undecodable policy list", Err: err}
	}
	out := make(map[string]*ast.Module, len(list.Result))
	for _, p := range list.Result {
		m, err := s.parser.Parse(p.ID, p.Raw)
		if err != nil {
			// OPA accepted it, so it parses there (other Rego version, ...):
			// keep its id so full bundles still manage it, compile without it.
			s.log.Warn("remote policy does not parse locally", "id", p.ID, "error", err)
			out[p.ID] = nil
			continue
		}
		out[p.ID] = m
	}
	return out, nil
}

// readData is GET /v1/data/<path>: the document and whether it is defined.
func (s *Store) readData(ctx context.Context, p []string) (any, bool, error) {
	body, err := s.do(ctx, "GET", dataURL(p), "", nil, http.StatusOK)
	if err != nil {
		return nil, false, err
	}
	var doc struct {
		Result *json.RawMessage `json:"result"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&doc); err != nil {
		return nil, false, &RemoteError{Method: "GET", Path: dataURL(p), Status: http.StatusOK, Body: "undecodable data", Err: err}
	}
	if doc.Result == nil {
		return nil, false, nil
	}
	d = json.NewDecoder(bytes.NewReader(*doc.Result))
	d.UseNumber() // numbers exactly as stored
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, false, &RemoteError{Method: "GET", Path: dataURL(p), Status: http.StatusOK, Body: "undecodable data", Err: err}
	}
	return v, true, nil
}

// policyURL is /v1/policies/<id>, each segment escaped ("a b?.rego").
func policyURL(id string) string { return "/v1/policies/" + escapePath(strings.Split(id, "/")) }

// dataURL is /v1/data/<path>, each segment escaped; the root is /v1/data.
func dataURL(p []string) string {
	if len(p) == 0 {
		return "/v1/data"
	}
	return "/v1/data/" + escapePath(p)
}

// escapePath joins segments with "/", each escaped for a URL path.
func escapePath(p []string) string {
	segs := make([]string, len(p))
	for i, s := range p {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// do sends one call with the bounded retry: 5xx and transport errors are
// tried again up to the attempts, other statuses are final. A PATCH is sent
// once: it is not idempotent (an "add" at "/-" appends again), and a lost
// answer may hide an applied patch.
func (s *Store) do(ctx context.Context, method, path, ctype string, body []byte, ok ...int) ([]byte, error) {
	attempts := s.attempts
	if method == http.MethodPatch {
		attempts = 1
	}
	for n := 1; ; n++ {
		status, resp, err := s.once(ctx, method, path, ctype, body, ok...)
		if err == nil {
			return resp, nil
		}
		if (status != 0 && status < 500) || n >= attempts || ctx.Err() != nil {
			return nil, err
		}
		s.log.Debug("opa write failed, retrying", "method", method, "path", path, "attempt", n, "error", err)
		if !backoff.Sleep(ctx, s.clock, s.wait(n)) {
			return nil, err
		}
	}
}

func (s *Store) once(ctx context.Context, method, path, ctype string, body []byte, ok ...int) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return 0, nil, &RemoteError{Method: method, Path: path, Err: err}
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// The transport error names the URL: OPAL_POLICY_STORE_URL may hold user info.
		return 0, nil, &RemoteError{Method: method, Path: path, Err: redact.Error(err)}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, &RemoteError{Method: method, Path: path, Err: err}
	}
	for _, c := range ok {
		if resp.StatusCode == c {
			return c, rb, nil
		}
	}
	msg := string(rb)
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	return resp.StatusCode, nil, &RemoteError{Method: method, Path: path, Status: resp.StatusCode, Body: msg}
}
