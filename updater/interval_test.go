package updater_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/updater"
)

// MinInterval coalesces a notification burst: 1,000 notifications in 1 s
// cost at most 2 fetches in any second, the first is fetched at once, and
// the last is always applied (a trailing fetch).
func TestMinInterval_BurstCoalesced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		published := 0 // the server's current policy version
		var starts []time.Time
		f := &fakeFetcher{gen: func() outcome {
			mu.Lock()
			defer mu.Unlock()
			starts = append(starts, time.Now())
			return outcome{bundle: full(fmt.Sprint(published))}
		}}
		st := memstore.New()
		u := updater.New(updater.Options{Store: st, Fetcher: f, MinInterval: 500 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = u.Run(ctx); close(done) }()
		defer func() { cancel(); u.Stop(); <-done }()

		publish := func() {
			mu.Lock()
			published++
			mu.Unlock()
			u.PolicyUpdate([]string{"."})
		}
		publish()
		synctest.Wait()
		// The first notification after a quiet period is fetched at once.
		if len(f.requests()) != 1 {
			t.Fatalf("first notification: %d fetches without waiting, want 1", len(f.requests()))
		}
		time.Sleep(10 * time.Second) // quiet
		begin := time.Now()
		for range 1000 {
			publish()
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()

		mu.Lock()
		defer mu.Unlock()
		// At most 2 fetch starts in any 1 s window of the burst. Mutation: the
		// hold dropped (one fetch per notification: 1,000).
		for i := range starts {
			n := 0
			for _, s := range starts[i:] {
				if s.Sub(starts[i]) < time.Second {
					n++
				}
			}
			if n > 2 {
				t.Fatalf("%d fetches within 1 s of %v", n, starts[i].Sub(begin))
			}
		}
		if h, _ := st.PolicyHash(context.Background()); h != fmt.Sprint(published) {
			t.Fatalf("store holds version %s, want the last notification's %d", h, published)
		}
		if first := starts[1].Sub(begin); first != 0 {
			t.Fatalf("first fetch of the burst %v after its first notification, want at once", first)
		}
	})
}
