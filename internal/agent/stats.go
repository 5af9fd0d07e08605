package agent

import (
	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/pubsub"
)

// statistics is the pub/sub client's statistics announcement: nil (none)
// unless OPAL_STATISTICS_ENABLED, as in the Python client.
func statistics(cfg *config.Config) *pubsub.Statistics {
	if !cfg.StatisticsEnabled { // guard: mutation "if false {" announces with statistics off
		return nil
	}
	return &pubsub.Statistics{ClientID: cfg.ClientStatID, Channel: cfg.StatisticsAddClientChannel}
}
