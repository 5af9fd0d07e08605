package memstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/updater"
)

var ctx = context.Background()

func bundle(hash string, old *string, mods map[string]string, data map[string]string) *fetcher.PolicyBundle {
	b := &fetcher.PolicyBundle{Hash: hash, OldHash: old}
	for p, r := range mods {
		b.PolicyModules = append(b.PolicyModules, fetcher.PolicyModule{Path: p, Rego: r})
	}
	for p, d := range data {
		b.DataModules = append(b.DataModules, fetcher.DataModule{Path: p, Data: d})
	}
	return b
}

func ptr(s string) *string { return &s }

// §5.2: a full bundle replaces the policies; a delta adds and deletes.
func TestApply(t *testing.T) {
	s := memstore.New()
	if err := s.ApplyPolicy(ctx, bundle("h1", nil, map[string]string{"a.rego": "A", "b.rego": "B"}, map[string]string{"x": `{"k":1}`})); err != nil {
		t.Fatal(err)
	}
	d := bundle("h2", ptr("h1"), map[string]string{"c.rego": "C"}, nil)
	d.DeletedFiles = &fetcher.DeletedFiles{PolicyModules: []string{"a.rego"}, DataModules: []string{"x"}}
	if err := s.ApplyPolicy(ctx, d); err != nil {
		t.Fatal(err)
	}
	p := s.Policies()
	if len(p) != 2 || p["b.rego"] != "B" || p["c.rego"] != "C" {
		t.Fatalf("policies %v", p)
	}
	if _, ok := s.Data("x"); ok {
		t.Fatal("deleted data module kept")
	}
	if err := s.ApplyPolicy(ctx, bundle("h3", nil, map[string]string{"z.rego": "Z"}, nil)); err != nil {
		t.Fatal(err)
	}
	if p := s.Policies(); len(p) != 1 {
		t.Fatalf("full bundle kept old policies: %v", p)
	}
}

// U3: every refused write leaves the store exactly as it was.
func TestU3_AllOrNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		prep func(s *memstore.Store)
		b    *fetcher.PolicyBundle
		is   func(error) bool
	}{
		{"base_mismatch", nil, bundle("h2", ptr("other"), map[string]string{"n.rego": "N"}, nil),
			func(err error) bool {
				var bm *updater.BaseMismatchError
				return errors.As(err, &bm) && bm.Current == "h1"
			}},
		{"bad_data_json", nil, bundle("h2", nil, map[string]string{"n.rego": "N"}, map[string]string{".": "{"}),
			func(err error) bool { return err != nil }},
		{"injected_write_failure", func(s *memstore.Store) { s.FailWrites(errors.New("boom")) },
			bundle("h2", nil, map[string]string{"n.rego": "N"}, nil), func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New()
			if err := s.ApplyPolicy(ctx, bundle("h1", nil, map[string]string{"a.rego": "A"}, nil)); err != nil {
				t.Fatal(err)
			}
			if tc.prep != nil {
				tc.prep(s)
			}
			if err := s.ApplyPolicy(ctx, tc.b); !tc.is(err) {
				t.Fatalf("error %v", err)
			}
			if h, _ := s.PolicyHash(ctx); h != "h1" || len(s.Policies()) != 1 || s.Policies()["a.rego"] != "A" {
				t.Fatalf("store changed: hash %q policies %v", h, s.Policies())
			}
		})
	}
}

func TestInjectedFailures(t *testing.T) {
	s := memstore.New()
	s.FailReads(errors.New("r"))
	if _, err := s.PolicyHash(ctx); err == nil {
		t.Fatal("read failure not injected")
	}
	s.FailHealth(errors.New("h"))
	if s.Health(ctx) == nil {
		t.Fatal("health failure not injected")
	}
	s.FailHealth(nil)
	if s.Health(ctx) != nil {
		t.Fatal("health failure not cleared")
	}
}

// Overlapping transactions are detected (the queue's U1 tests rely on it).
func TestOverlapDetected(t *testing.T) {
	s := memstore.New()
	inner := false
	s.BeforeWrite = func(ctx context.Context) {
		if !inner {
			inner = true
			_ = s.SetData(ctx, "/x", 1)
		}
	}
	_ = s.ApplyPolicy(ctx, bundle("h1", nil, nil, nil))
	if s.Overlaps() != 1 || s.Writes() != 2 {
		t.Fatalf("overlaps %d writes %d, want 1 and 2", s.Overlaps(), s.Writes())
	}
}
