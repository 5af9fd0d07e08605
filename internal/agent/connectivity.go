// This file is the agent's connectivity state as the rest of it sees it: the
// pub/sub socket's connected/lost state (staleness, max age, resync) and the
// reload refused while offline mode keeps connectivity disabled (offline.go).

package agent

import "errors"

// ErrConnectivityDisabled refuses a data reload while offline mode keeps the
// agent away from the OPAL server (POST /data-updater/trigger answers 503).
var ErrConnectivityDisabled = errors.New("agent: OPAL server connectivity is disabled")

// triggerData serves POST /data-updater/trigger. While connectivity is
// disabled the data updater is stopped (or, disabled from the start, must
// not start its polls), so the reload is refused.
func (a *Agent) triggerData() error {
	if a.ServerConnectivityDisabled() { // guard: mutation "if false {" starts data polls while disconnected
		return ErrConnectivityDisabled
	}
	return a.dataUpdater().Trigger()
}

// onPubSubState records the socket's state. A lost connection makes the
// policy possibly behind from now (an update may go unseen) until the next
// successful update, which the reconnect's full update normally is; a
// closing at shutdown does not.
func (a *Agent) onPubSubState(connected bool) {
	a.metrics.PubSubState(connected)
	a.tracker.PubSubState(connected)
	if !connected && !a.shuttingDown() { // guard: mutation "if false {" leaves a lost server unnoticed by staleness and max age
		a.tracker.Lost(a.clk.Now())
		if a.resync != nil { // nil in unit tests built without New
			a.resync.Lost(a.clk.Now())
		}
	}
}
