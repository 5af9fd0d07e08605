package pubsub_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// End-to-end through real loopback sockets: waits are on real I/O, with
// deadlines, never sleeps.

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	tm := time.NewTimer(10 * time.Second)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.C:
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func wsURL(hs *httptest.Server) string { return "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws" }

// TestDevserver_3_2_NotifyAndReconnect: the client subscribes on the dev
// server, gets the §3.2 notification after a change, and after the server
// drops every socket reconnects with exactly one connect trigger per
// accepted handshake.
func TestDevserver_3_2_NotifyAndReconnect(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "rbac"), 0o755)
	os.WriteFile(filepath.Join(dir, "rbac", "r.rego"), []byte("package r\n"), 0o644)
	srv := devserver.New(devserver.Options{PolicyDir: dir, Token: "tok", CallGetChannelID: true, Logger: quiet()})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()

	connects := make(chan struct{}, 10)
	notes := make(chan string, 10)
	c := pubsub.New(pubsub.Options{
		URL: wsURL(hs), Token: "tok", Topics: []string{"policy:rbac", "policy_data"},
		OnConnect: func() { connects <- struct{}{} },
		OnNotify:  func(topic string, data json.RawMessage) { notes <- topic + " " + string(data) },
		Logger:    quiet(),
		// Real time: a short spread keeps the reconnect within the wait.
		ReconnectSpread: 500 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wait(t, connects, "first connect")

	old := srv.Hash()
	os.WriteFile(filepath.Join(dir, "rbac", "r.rego"), []byte("package r\nx := 1\n"), 0o644)
	if changed, err := srv.Rescan(); !changed || err != nil {
		t.Fatalf("Rescan = %v %v", changed, err)
	}
	want := `policy:rbac {"changed_directories":[".","rbac"],"new_policy_hash":"` + srv.Hash() + `","old_policy_hash":"` + old + `"}`
	if got := wait(t, notes, "notify"); got != want {
		t.Fatalf("notify\n got %s\nwant %s", got, want)
	}

	srv.DropAllSockets()
	wait(t, connects, "reconnect")
	cancel()
	wait(t, done, "Run to return")
	accepted := 0
	for _, r := range srv.Requests() {
		if r.Path == "/ws" && r.Status == 101 {
			accepted++
		}
	}
	if accepted != 2 || len(connects) != 0 {
		t.Fatalf("%d accepted handshakes, %d extra connect triggers; want 2 and 0", accepted, len(connects))
	}
}

// TestProtocol_2_7_RestartStorm: 200 clients lose their sockets while the
// server refuses handshakes for a second (a restart); when it comes back the
// reconnects are spread by the jitter, not bunched.
func TestProtocol_2_7_RestartStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time storm")
	}
	const n = 200
	srv := devserver.New(devserver.Options{Logger: quiet()})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()

	var connects atomic.Int64
	all := make(chan struct{}, 2*n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		c := pubsub.New(pubsub.Options{
			URL: wsURL(hs), Topics: []string{"policy:."},
			OnConnect: func() { connects.Add(1); all <- struct{}{} },
			Logger:    quiet(),
			// A short spread keeps this real-time test short.
			ReconnectSpread: 2 * time.Second,
		})
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	for i := 0; i < n; i++ {
		wait(t, all, "initial connects")
	}

	srv.RefuseHandshakes(503)
	srv.DropAllSockets()
	down := time.NewTimer(time.Second) // the restart's downtime: real I/O wait
	<-down.C
	reopened := time.Now()
	srv.RefuseHandshakes(0)
	for i := 0; i < n; i++ {
		wait(t, all, "reconnects")
	}

	var times []time.Time
	for _, r := range srv.Requests() {
		if r.Path == "/ws" && r.Status == 101 && r.Time.After(reopened) {
			times = append(times, r.Time)
		}
	}
	if len(times) != n {
		t.Fatalf("%d reconnects after reopening, want %d", len(times), n)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	// Spread: the middle 80% of reconnects span at least 300 ms. Without
	// jitter every client waits the same and they land within a few ms.
	spread := times[n*9/10].Sub(times[n/10])
	if spread < 300*time.Millisecond {
		t.Fatalf("reconnects bunched: middle 80%% within %v", spread)
	}
	t.Logf("middle 80%% of %d reconnects spread over %v", n, spread)
}
