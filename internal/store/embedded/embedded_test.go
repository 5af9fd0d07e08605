package embedded

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

const (
	rbacV1 = st.RbacV1
	rbacV2 = st.RbacV2
	extra  = "package app.extra\n\nx := data.extra.value\n"
	broken = "package app.rbac\n\nallow if {\n" // does not parse
	// unsafe: parses, fails to compile (unsafe variable).
	unsafe = "package app.bad\n\nallow if y > 1\n"
)

func newStore(t *testing.T, ignore ...string) (*Store, st.OPA) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, Options{Addr: "127.0.0.1:0", PolicyPathsToIgnore: ignore})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return s, st.OPA{T: t, Base: "http://" + s.Addr()}
}

// TestConformance runs the store suite (bundles, U3, ownership, data
// writes, health) that the REST store passes too.
func TestConformance(t *testing.T) {
	st.Run(t, st.Harness{Kind: st.Embedded, New: func(t *testing.T, ignore ...string) st.Subject {
		s, o := newStore(t, ignore...)
		return st.Subject{Store: s, OPA: o, Down: func() {
			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		}}
	}})
}

func decide(t *testing.T, o st.OPA, user string) string { t.Helper(); return st.Decide(t, o, user) }

func isCompile(err error) bool { var e *store.CompileError; return errors.As(err, &e) }
func isData(err error) bool    { var e *store.DataError; return errors.As(err, &e) }
