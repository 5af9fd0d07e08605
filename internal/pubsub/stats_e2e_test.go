package pubsub_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// TestDevserver_StatisticsAnnouncement: against a server behaving like one
// with OPAL_STATISTICS_ENABLED (it asks the channel id before answering
// subscribe), the announcement reaches a subscriber of the statistics
// channel, as the server's statistics module would receive it.
func TestDevserver_StatisticsAnnouncement(t *testing.T) {
	srv := devserver.New(devserver.Options{CallGetChannelID: true, Logger: quiet()})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()

	got := make(chan json.RawMessage, 4)
	watching := make(chan struct{}, 1)
	run := func(o pubsub.Options) func() {
		c := pubsub.New(o)
		done := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		go func() { defer close(done); _ = c.Run(ctx) }()
		return func() { cancel(); wait(t, done, "client stop") }
	}
	stopWatcher := run(pubsub.Options{URL: wsURL(hs), Topics: []string{pubsub.DefaultStatisticsChannel}, Logger: quiet(),
		OnConnect: func() { watching <- struct{}{} },
		OnNotify:  func(_ string, data json.RawMessage) { got <- data }})
	defer stopWatcher()
	wait(t, watching, "the statistics watcher to subscribe")

	stopClient := run(pubsub.Options{URL: wsURL(hs), Topics: []string{"policy:.", "policy_data"}, Logger: quiet(),
		Statistics: &pubsub.Statistics{ClientID: "CLIENT_e2e"}})
	defer stopClient()

	var m struct {
		Topics   []string `json:"topics"`
		ClientID string   `json:"client_id"`
		RPCID    string   `json:"rpc_id"`
	}
	if err := json.Unmarshal(wait(t, got, "the statistics announcement"), &m); err != nil {
		t.Fatal(err)
	}
	if m.ClientID != "CLIENT_e2e" || len(m.Topics) != 2 || m.Topics[0] != "policy:." || len(m.RPCID) != 32 {
		t.Fatalf("announcement %+v", m)
	}
}
