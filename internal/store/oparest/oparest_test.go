package oparest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/internal/store/embedded"
	st "github.com/opal-go/opal-client/internal/store/storetest"
	"github.com/opal-go/opal-client/updater"
)

const (
	rbacV1 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"alice\"\n"
	rbacV2 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"bob\"\n"
	extra  = "package app.extra\n\nx := data.extra.value\n"
	unsafe = "package app.bad\n\nallow if y > 1\n"
	// uses needs lib, which comes after it in the manifest.
	uses = "package a.uses\n\nimport data.z.lib\n\nok if lib.f(1)\n"
	lib  = "package z.lib\n\nf(x) := x + 1\n"
)

// remote is a real OPA server (from the OPA Go module, on a loopback port)
// behind a proxy that counts writes, checks the token and can fail writes.
type remote struct {
	opa    st.OPA // direct, for assertions
	url    string // through the proxy
	mu     sync.Mutex
	writes int
	failAt int // fail (500) every policy write from this one on (0 = never)
	auth   []string
	// lostPatch applies each PATCH, then answers 500 (a lost answer).
	lostPatch bool
	patches   int
}

func newRemote(t *testing.T) *remote {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := embedded.New(ctx, embedded.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	})
	r := &remote{opa: st.OPA{T: t, Base: "http://" + e.Addr()}}
	target, _ := url.Parse(r.opa.Base)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		write := req.Method != "GET"
		policy := strings.HasPrefix(req.URL.Path, "/v1/policies/")
		if write && policy {
			r.writes++
		}
		fail := write && policy && r.failAt > 0 && r.writes >= r.failAt
		lost := req.Method == "PATCH" && r.lostPatch
		if req.Method == "PATCH" {
			r.patches++
		}
		r.mu.Unlock()
		if lost {
			proxy.ServeHTTP(httptest.NewRecorder(), req)
			http.Error(w, `{"code":"internal_error"}`, http.StatusInternalServerError)
			return
		}
		if fail {
			http.Error(w, `{"code":"internal_error"}`, http.StatusInternalServerError)
			return
		}
		if write && !policy {
			r.mu.Lock()
			r.writes++
			r.mu.Unlock()
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *remote) count() int { r.mu.Lock(); defer r.mu.Unlock(); return r.writes }

func newStore(t *testing.T, r *remote, opts Options) *Store {
	t.Helper()
	opts.URL = r.url
	opts.Wait = func(int) time.Duration { return 0 } // no real waits in tests
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func decide(t *testing.T, o st.OPA, user string) string {
	t.Helper()
	code, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"`+user+`"}}`)
	if code != 200 {
		t.Fatalf("decision: %d %s", code, body)
	}
	return body
}

func TestBundleSequence(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{AuthToken: "s3cret"})
	ctx := context.Background()
	o := r.opa
	// Dependents first in the manifest: the postponed retry uploads lib, then uses.
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1, "extra/extra.rego": extra, "a/uses.rego": uses, "z/lib.rego": lib},
		map[string]string{"extra": `{"value": 1}`, "rbac": `{"roles": ["admin"]}`})); err != nil {
		t.Fatal(err)
	}
	if got := decide(t, o, "alice"); got != `{"result":true}` {
		t.Fatalf("after full: %s", got)
	}
	if got := o.Get("/v1/data/a/uses/ok"); got != `{"result":true}` {
		t.Fatalf("postponed module: %s", got)
	}
	if err := s.ApplyPolicy(ctx, st.Delta("h1", "h2", map[string]string{"rbac/rbac.rego": rbacV2}, nil,
		[]string{"extra/extra.rego", "a/uses.rego", "z/lib.rego"}, []string{"extra"})); err != nil {
		t.Fatal(err)
	}
	if got := decide(t, o, "bob"); got != `{"result":true}` {
		t.Fatalf("after delta: %s", got)
	}
	for _, id := range []string{"extra/extra.rego", "a/uses.rego", "z/lib.rego"} {
		if code, _ := o.Do("GET", "/v1/policies/"+id, ""); code != 404 {
			t.Fatalf("deleted policy %s still there", id)
		}
	}
	if got := o.Get("/v1/data/extra"); got != `{}` {
		t.Fatalf("deleted data file kept: %s", got)
	}
	if err := s.ApplyPolicy(ctx, st.Full("h3", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/rbac"); got != `{}` {
		t.Fatalf("data of a removed data.json kept: %s", got)
	}
	if h, _ := s.PolicyHash(ctx); h != "h3" {
		t.Fatalf("hash %q", h)
	}
	t.Run("token_sent", func(t *testing.T) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, a := range r.auth {
			if a != "Bearer s3cret" {
				t.Fatalf("Authorization = %q", a)
			}
		}
	})
}

// TestU3_RefusedBeforeAnyWrite: a bundle that does not compile, bad data
// JSON, or a delta on the wrong base never reaches the remote.
func TestU3_RefusedBeforeAnyWrite(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{})
	ctx := context.Background()
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, map[string]string{"extra": `{"value": 1}`})); err != nil {
		t.Fatal(err)
	}
	before, writes := r.opa.Snapshot(), r.count()
	for _, tc := range []struct {
		name string
		err  func() error
		want func(error) bool
	}{
		// Catches: skipping the local compile before writing.
		{"U3_compile_error_never_written", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2, "bad.rego": unsafe}, map[string]string{"extra": `{"value": 2}`}))
		}, func(err error) bool { var e *store.CompileError; return errors.As(err, &e) }},
		{"U3_invalid_data_json", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2}, map[string]string{"extra": `nope`}))
		}, func(err error) bool { var e *store.DataError; return errors.As(err, &e) }},
		{"delta_wrong_base_refused", func() error {
			return s.ApplyPolicy(ctx, st.Delta("h0", "h2", map[string]string{"rbac/rbac.rego": rbacV2}, nil, nil, nil))
		}, func(err error) bool { var e *updater.BaseMismatchError; return errors.As(err, &e) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.err(); err == nil || !tc.want(err) {
				t.Fatalf("err = %v", err)
			}
			if r.count() != writes {
				t.Fatalf("%d writes reached the remote", r.count()-writes)
			}
			if r.opa.Snapshot() != before {
				t.Fatal("remote changed")
			}
		})
	}
}

// TestHalfWayFailure: the remote fails a write half-way; the error says so,
// the hash is cleared (no delta on a mixed state), the next full bundle repairs.
func TestHalfWayFailure(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{Attempts: 3})
	ctx := context.Background()
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	w0 := r.writes
	r.failAt = w0 + 2 // the data write goes through, every policy write fails
	r.mu.Unlock()
	err := s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"a.rego": "package a\n\nx := 1\n", "rbac/rbac.rego": rbacV2}, map[string]string{"d": `{"v": 1}`}))
	var pe *PartialWriteError
	var re *RemoteError
	if !errors.As(err, &pe) || !errors.As(err, &re) || re.Status != 500 {
		t.Fatalf("err = %v", err)
	}
	t.Run("hash_cleared", func(t *testing.T) {
		if h, _ := s.PolicyHash(ctx); h != "" {
			t.Fatalf("hash = %q after a partial write", h)
		}
	})
	// Catches: retrying without bound, or not retrying a 5xx.
	t.Run("bounded_retry", func(t *testing.T) {
		if pe.Writes != 1 || r.count()-w0 != 1+3 {
			t.Fatalf("writes: %d succeeded, %d sent; want 1 and 1+3 tries", pe.Writes, r.count()-w0)
		}
	})
	r.mu.Lock()
	r.failAt = 0
	r.mu.Unlock()
	if err := s.ApplyPolicy(ctx, st.Full("h3", map[string]string{"rbac/rbac.rego": rbacV2}, nil)); err != nil {
		t.Fatalf("recovery: %v", err)
	}
	t.Run("recovered_by_full_bundle", func(t *testing.T) {
		if got := decide(t, r.opa, "bob"); got != `{"result":true}` {
			t.Fatalf("bob = %s", got)
		}
		if code, _ := r.opa.Do("GET", "/v1/policies/a.rego", ""); code != 404 {
			t.Fatal("half-written module left behind")
		}
		if got := r.opa.Get("/v1/data/d"); got != `{}` {
			t.Fatalf("half-written data left behind: %s", got)
		}
	})
}

func TestFullBundleLeavesUnmanaged(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{PolicyPathsToIgnore: []string{"keep/**"}})
	o := r.opa
	o.Must("PUT", "/v1/policies/keep/mine.rego", "package keep.mine\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/sys.rego", "package system.custom\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/other.rego", "package other\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/data/users", `{"bob": "admin"}`, 204)
	if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1},
		map[string]string{".": `{"a": 1}`})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"ignored_id_survives", "/v1/data/keep/mine/x", `{"result":1}`},
		{"system_package_survives", "/v1/data/system/custom/x", `{"result":1}`},
		{"unmanaged_other_deleted", "/v1/data/other/x", `{}`},
		{"root_data_key_written", "/v1/data/a", `{"result":1}`},
		{"root_data_keeps_other_keys", "/v1/data/users", `{"result":{"bob":"admin"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("%s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{})
	if err := s.Health(context.Background()); err != nil {
		t.Fatalf("healthy remote: %v", err)
	}
	down, err := New(Options{URL: "http://127.0.0.1:1", Wait: func(int) time.Duration { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := down.Health(context.Background()); err == nil {
		t.Fatal("unreachable remote reported healthy")
	}
}

// TestU3_DeltaRewriteKeepsNestedOwnedData: as in the embedded store, a
// delta that rewrites or deletes data.a keeps data.a.b (fetched first).
func TestU3_DeltaRewriteKeepsNestedOwnedData(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delta   map[string]string
		deleted []string
		want    string
	}{
		// Catches: not fetching the kept data before the writes.
		{"rewrite_keeps_nested", map[string]string{"a": `{"x":9}`}, nil, `{"result":{"b":{"y":2},"x":9}}`},
		{"delete_keeps_nested", nil, []string{"a"}, `{"result":{"b":{"y":2}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRemote(t)
			s := newStore(t, r, Options{})
			ctx := context.Background()
			if err := s.ApplyPolicy(ctx, st.Full("h1", nil, map[string]string{"a": `{"x":1}`, "a/b": `{"y":2}`})); err != nil {
				t.Fatal(err)
			}
			if err := s.ApplyPolicy(ctx, st.Delta("h1", "h2", nil, tc.delta, nil, tc.deleted)); err != nil {
				t.Fatal(err)
			}
			if got := r.opa.Get("/v1/data/a"); got != tc.want {
				t.Fatalf("data.a = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestPolicyIDs: a module path OPA would store under another id is refused
// before any write (the next full bundle would delete it while reporting
// success); ids with URL metacharacters reach OPA under their own name.
func TestPolicyIDs(t *testing.T) {
	isID := func(err error) bool { var e *store.PolicyIDError; return errors.As(err, &e) }
	for _, tc := range []struct{ name, id string }{
		// Catches: unclean ids taken as they are.
		{"leading_slash_refused", "/x.rego"},
		{"double_slash_refused", "a//b.rego"},
		{"dot_segment_refused", "./x.rego"},
		{"parent_segment_refused", "../x.rego"},
		// Catches: a NUL byte taken into an id (OPA would cut or refuse it half-way).
		{"nul_refused", "a\x00b.rego"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRemote(t)
			s := newStore(t, r, Options{})
			ctx := context.Background()
			if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
				t.Fatal(err)
			}
			before, writes := r.opa.Snapshot(), r.count()
			err := s.ApplyPolicy(ctx, st.Full("h2", map[string]string{tc.id: "package x\n\ny := 1\n"}, nil))
			if !isID(err) {
				t.Fatalf("err = %v, want *store.PolicyIDError", err)
			}
			if r.count() != writes || r.opa.Snapshot() != before {
				t.Fatal("remote changed")
			}
		})
	}
	// Catches: an id sent unescaped ("?" would start a query).
	t.Run("segments_escaped", func(t *testing.T) {
		r := newRemote(t)
		s := newStore(t, r, Options{})
		if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"a b/c?.rego": "package x\n\ny := 1\n"}, nil)); err != nil {
			t.Fatal(err)
		}
		if code, body := r.opa.Do("GET", "/v1/policies/a%20b/c%3F.rego", ""); code != 200 {
			t.Fatalf("policy not under its id: %d %s", code, body)
		}
	})
}
