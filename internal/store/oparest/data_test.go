package oparest

import (
	"context"
	"errors"
	"testing"

	"github.com/opal-go/opal-client/internal/dataupdater"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// TestPatchNotRetried: a JSON-Patch is not idempotent (an "add" at "/-"
// appends again), so a PATCH whose answer is lost is not sent again: the
// entry fails and the data updater re-fetches or defers it.
func TestPatchNotRetried(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{Attempts: 3})
	ctx := context.Background()
	if err := s.WriteData(ctx, dataupdater.Write{Path: []string{"users"}, Method: dataupdater.MethodPut, Value: st.Value(t, `{"l":[]}`)}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.lostPatch = true
	r.mu.Unlock()
	err := s.WriteData(ctx, dataupdater.Write{Path: []string{"users"}, Method: dataupdater.MethodPatch,
		Patch: st.Patch(t, `[{"op":"add","path":"/l/-","value":1}]`)})
	var re *RemoteError
	if !errors.As(err, &re) || re.Status != 500 {
		t.Fatalf("err = %v, want the 500", err)
	}
	// Catches: retrying a PATCH like an idempotent call.
	t.Run("patch_sent_once", func(t *testing.T) {
		r.mu.Lock()
		n := r.patches
		r.mu.Unlock()
		if n != 1 {
			t.Fatalf("%d PATCH requests, want 1", n)
		}
		if got := r.opa.Get("/v1/data/users"); got != `{"result":{"l":[1]}}` {
			t.Fatalf("users = %s", got)
		}
	})
}
