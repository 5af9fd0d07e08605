package updater_test

import (
	"testing"

	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/updater"
)

// A notification flood while an update runs: each enqueue coalesces with the
// queue's tail, so the cost per notification is flat and memory does not grow.
func BenchmarkPolicyUpdateFlood(b *testing.B) {
	u := updater.New(updater.Options{Store: memstore.New(), Fetcher: nil, Dirs: []string{"a", "b", "c"}})
	changed := []string{".", "a", "b"}
	b.ReportAllocs()
	for b.Loop() {
		u.PolicyUpdate(changed)
	}
	if n := u.Len(); n != 1 {
		b.Fatalf("queue length %d after the flood, want 1", n)
	}
}
