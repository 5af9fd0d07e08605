package agent

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/updater"
)

// healthStore counts the health-policy writes (each one a compile).
type healthStore struct {
	*memstore.Store
	mu     sync.Mutex
	writes []string
}

func (s *healthStore) SetHealthPolicy(_ context.Context, rego string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, rego)
	return nil
}

// TestHealthPolicyCoalesced: a burst of health-policy writes is one write
// of the latest policy, through the update queue (U1).
func TestHealthPolicyCoalesced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &healthStore{Store: memstore.New()}
		cfg, err := config.LoadFrom(func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		a := &Agent{cfg: cfg, store: st, clk: clock.NewMock(), log: slog.New(slog.DiscardHandler)}
		a.queue = updater.New(updater.Options{Store: st, Clock: a.clk})
		w := &queuedHealthPolicy{a: a}
		for i := 0; i < 3000; i++ {
			_ = w.SetHealthPolicy(t.Context(), fmt.Sprint("package system.opal # ", i))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.queue.Run(ctx) }()
		synctest.Wait()
		cancel()
		<-done
		if len(st.writes) != 1 || !strings.HasSuffix(st.writes[0], "# 2999") {
			t.Fatalf("%d health-policy writes, want 1 of the latest", len(st.writes))
		}
	})
}

// TestNoSecretAtStart: OPAL_SERVER_URL's user info never reaches the log.
func TestNoSecretAtStart(t *testing.T) {
	const secret = "SRV-S3CRET"
	srv := newTestServer(t, exampleFiles(t))
	u := strings.Replace(srv.srv.URL, "http://", "http://"+secret+":"+secret+"@", 1)
	ws := strings.Replace(srv.srv.URL, "http://", "ws://", 1) + "/ws"
	h := start(t, srv, map[string]string{"OPAL_SERVER_URL": u, "OPAL_SERVER_PUBSUB_URL": ws})
	h.successTx()
	if logs := h.logs.String(); strings.Contains(logs, secret) || !strings.Contains(logs, "xxxxx@") {
		t.Fatalf("the start line does not redact the server URL:\n%s", logs)
	}
}
