package pubsub

import (
	"context"
)

// DefaultStatisticsChannel is the topic an OPAL server's statistics listen on
// for new clients (the Python STATISTICS_ADD_CLIENT_CHANNEL).
const DefaultStatisticsChannel = "__opal_stats_add"

// Statistics, set in Options, makes the client announce itself on the
// server's statistics channel after every subscribe, as the Python client
// does with OPAL_STATISTICS_ENABLED=true (opal-protocol §2.3): one publish
// of {"topics", "client_id", "rpc_id"}, rpc_id being the channel id this
// connection answers _get_channel_id_ with.
type Statistics struct {
	// ClientID names the client across its connections
	// (OPAL_OPAL_CLIENT_STAT_ID); empty: NewClientStatID's, drawn once in New.
	ClientID string
	// Channel is the topic published to; empty: DefaultStatisticsChannel.
	Channel string
}

// NewClientStatID is the Python client's default statistics id: "CLIENT_"
// and 32 random hex digits.
func NewClientStatID() string { return "CLIENT_" + NewCallID() }

// withDefaults fills in Statistics' zero values; New calls it once, so a
// generated ClientID stays the same across reconnects.
func (st *Statistics) withDefaults() *Statistics {
	if st == nil {
		return nil
	}
	c := *st
	if c.ClientID == "" {
		c.ClientID = NewClientStatID()
	}
	if c.Channel == "" {
		c.Channel = DefaultStatisticsChannel
	}
	return &c
}

// publishArgs are the server's publish arguments (§2.3), in the Python
// client's order.
type publishArgs struct {
	Topics     []string `json:"topics"`
	Data       any      `json:"data"`
	Sync       bool     `json:"sync"`
	NotifierID *string  `json:"notifier_id"`
}

type statsMessage struct {
	Topics   []string `json:"topics"`
	ClientID string   `json:"client_id"`
	RPCID    string   `json:"rpc_id"`
}

// announce publishes the statistics message once, bounded by
// SubscribeTimeout. A refusal or no answer is logged and the connection
// kept: the statistics are the server's bookkeeping, and a subscribed
// socket matters more. (The Python client awaits the answer without a
// bound.)
func (s *session) announce(ctx context.Context) {
	defer s.wg.Done()
	st := s.c.o.Statistics
	args := publishArgs{
		Topics: []string{st.Channel},
		Data:   statsMessage{Topics: s.c.o.Topics, ClientID: st.ClientID, RPCID: s.chanID},
		Sync:   true,
	}
	r, err := s.call(ctx, "publish", args, s.c.o.SubscribeTimeout)
	switch {
	case err != nil:
		s.c.log.Warn("pub/sub: statistics announcement not answered", "err", err)
	case string(r.Result) != "true":
		s.c.log.Warn("pub/sub: statistics announcement refused by server", "result", string(r.Result))
	default:
		s.c.log.Debug("pub/sub: announced on the statistics channel", "client_id", st.ClientID, "channel", st.Channel)
	}
}
