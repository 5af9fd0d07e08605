package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// TestStatistics_FromConfig: the announcement follows OPAL_STATISTICS_ENABLED,
// OPAL_OPAL_CLIENT_STAT_ID and OPAL_STATISTICS_ADD_CLIENT_CHANNEL.
func TestStatistics_FromConfig(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		want    bool
		id, top string
	}{
		{"off_by_default", nil, false, "", ""},
		{"on_with_defaults", map[string]string{"OPAL_STATISTICS_ENABLED": "true"}, true, "", "__opal_stats_add"},
		{"on_with_id_and_channel", map[string]string{"OPAL_STATISTICS_ENABLED": "1", "OPAL_OPAL_CLIENT_STAT_ID": "pod-a",
			"OPAL_STATISTICS_ADD_CLIENT_CHANNEL": "stats_in"}, true, "pod-a", "stats_in"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.LoadFrom(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			st := statistics(cfg)
			if (st != nil) != tc.want {
				t.Fatalf("statistics %+v, want enabled=%v", st, tc.want)
			}
			if st != nil && (st.ClientID != tc.id || st.Channel != tc.top) {
				t.Fatalf("statistics %+v, want id %q channel %q", st, tc.id, tc.top)
			}
		})
	}
}

// TestStatistics_AnnouncedThroughTheAgent: with OPAL_STATISTICS_ENABLED the
// agent's socket announces itself, and a subscriber of the statistics channel
// on the dev server (where the server's statistics would listen) receives it.
// Mutation: `Statistics:      statistics(a.cfg),` -> `Statistics:      nil,`.
func TestStatistics_AnnouncedThroughTheAgent(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	got := make(chan json.RawMessage, 4)
	watching := make(chan struct{}, 1)
	w := pubsub.New(pubsub.Options{
		URL: "ws" + strings.TrimPrefix(srv.srv.URL, "http") + "/ws", Token: srv.token,
		Topics:    []string{config.DefaultStatisticsAddClientChannel},
		OnConnect: func() { watching <- struct{}{} },
		OnNotify:  func(_ string, data json.RawMessage) { got <- data },
		Logger:    slog.New(slog.DiscardHandler),
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = w.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	dl := time.NewTimer(deadline)
	defer dl.Stop()
	select {
	case <-watching:
	case <-dl.C:
		t.Fatal("the statistics watcher did not connect")
	}

	start(t, srv, map[string]string{"OPAL_STATISTICS_ENABLED": "true", "OPAL_OPAL_CLIENT_STAT_ID": "pod-1"})
	var m struct {
		Topics   []string `json:"topics"`
		ClientID string   `json:"client_id"`
	}
	select {
	case b := <-got:
		if err := json.Unmarshal(b, &m); err != nil || m.ClientID != "pod-1" || !slices.Contains(m.Topics, "policy:.") {
			t.Fatalf("announcement %s (%v)", b, err)
		}
	case <-dl.C:
		t.Fatal("no statistics announcement")
	}
}
