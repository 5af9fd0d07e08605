package embedded

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// The parse cache holds the modules in the store and no others: a module a
// bundle removed is dropped from it, so the cache never grows past the
// policy. Mutation caught: the Forget after the commit dropped.
func TestParserCacheHoldsOnlyStoredModules(t *testing.T) {
	ctx := context.Background()
	three := map[string]string{"a.rego": "package a\n\nx := 1\n", "b.rego": "package b\n\nx := 1\n", "c.rego": "package c\n\nx := 1\n"}
	for _, tc := range []struct {
		name string
		want int
	}{
		{"full_bundle_drops_removed_modules", 1},
		{"delta_drops_deleted_modules", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			if err := s.ApplyPolicy(ctx, st.Full("h1", three, nil)); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.want == 1 {
				err = s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"a.rego": three["a.rego"]}, nil))
			} else {
				err = s.ApplyPolicy(ctx, st.Delta("h1", "h2", nil, nil, []string{"c.rego"}, nil))
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.parser.Cached(); got != tc.want {
				t.Errorf("parse cache holds %d modules, want the %d in the store", got, tc.want)
			}
		})
	}
}

// After a policy change is committed the freed heap (the previous
// compiler) is handed back to the OS. Mutation caught: the releaseMemory
// call after the commit dropped.
func TestPolicyChangeReleasesFreedMemory(t *testing.T) {
	s, _ := newStore(t)
	released := make(chan struct{}, 16)
	s.freeOSMemory = func() { released <- struct{}{} }
	if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"a.rego": "package a\n\nx := 1\n"}, nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second): // a failure bound, not a wait for success
		t.Fatal("no memory release after a committed policy change")
	}
}

// Data modules are decoded in parallel, and the error names the first bad
// one in bundle order, whichever worker met it first. Mutation caught: the
// last module's directory reported.
func TestDataErrorNamesFirstBadModule(t *testing.T) {
	s, _ := newStore(t)
	data := map[string]string{"a": `{"ok": 1}`, "b": `{"bad": `, "c": `{"ok": 2}`, "d": `[1,`}
	err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"p.rego": "package p\n\nx := 1\n"}, data))
	var de *store.DataError
	if !errors.As(err, &de) || de.Dir != "b" {
		t.Fatalf("err = %v, want *store.DataError for b", err)
	}
}

// An apply empties the bundle's data text once decoded, so a large
// bundle's text and its decoded values are not both alive while it is
// applied. Mutation caught: the text left in place.
func TestApplyReleasesDataText(t *testing.T) {
	s, o := newStore(t)
	b := st.Full("h1", map[string]string{"p.rego": "package p\n\nx := data.d.v\n"}, map[string]string{"d": `{"v": 7}`})
	if err := s.ApplyPolicy(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if b.DataModules[0].Data != "" {
		t.Errorf("data text still held after the apply: %q", b.DataModules[0].Data)
	}
	if got := o.Get("/v1/data/p/x"); got != `{"result":7}` {
		t.Fatalf("data.p.x = %s", got)
	}
}
