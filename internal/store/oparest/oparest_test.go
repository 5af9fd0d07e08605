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

	"github.com/opal-go/opal-client/internal/store/embedded"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

const (
	rbacV1 = st.RbacV1
	rbacV2 = st.RbacV2
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
	srv       *httptest.Server
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
	r.url, r.srv = srv.URL, srv
	return r
}

// down closes the proxy: the store's OPA is unreachable.
func (r *remote) down() { r.srv.Close() }

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

func decide(t *testing.T, o st.OPA, user string) string { t.Helper(); return st.Decide(t, o, user) }

// TestConformance runs the store suite (bundles, U3, ownership, data
// writes, health) that the embedded store passes too, against a real OPA
// behind the counting proxy.
func TestConformance(t *testing.T) {
	st.Run(t, st.Harness{Kind: st.REST, New: func(t *testing.T, ignore ...string) st.Subject {
		r := newRemote(t)
		s := newStore(t, r, Options{PolicyPathsToIgnore: ignore})
		return st.Subject{Store: s, OPA: r.opa, Writes: r.count, Down: r.down}
	}})
}

// TestAuthToken: every call to the remote carries the configured token.
func TestAuthToken(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{AuthToken: "s3cret"})
	ctx := context.Background()
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, map[string]string{"rbac": `{"roles": ["admin"]}`})); err != nil {
		t.Fatal(err)
	}
	if err := s.Health(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("token_sent", func(t *testing.T) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.auth) == 0 {
			t.Fatal("no call reached the remote")
		}
		for _, a := range r.auth {
			if a != "Bearer s3cret" {
				t.Fatalf("Authorization = %q", a)
			}
		}
	})
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
