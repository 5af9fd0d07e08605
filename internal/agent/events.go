// This file routes the events the agent receives: a pub/sub (re)connect and
// its resync, each notify (policy topics to the update queue, the rest to the
// data updater), and each finished policy transaction.

package agent

import (
	"encoding/json"

	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/updater"
)

// onConnect runs once per (re)connect: its resync, at once or spread when
// a policy is already held (internal/resync).
func (a *Agent) onConnect() {
	a.resync.Connected(a.serving())
}

// resyncNow is a connect's resync: exactly one full-update trigger
// (D5, D6) and the data updater's base-data reload.
func (a *Agent) resyncNow() {
	if a.cfg.PolicyUpdaterEnabled {
		a.metrics.UpdateRequested("connect")
		a.queue.Connect()
	}
	if d := a.dataUpdater(); d != nil {
		d.OnConnect()
	}
}

// policyMessage is the notify payload of a policy topic (protocol §3.2);
// every field is required.
type policyMessage struct {
	OldPolicyHash      *string   `json:"old_policy_hash"`
	NewPolicyHash      *string   `json:"new_policy_hash"`
	ChangedDirectories *[]string `json:"changed_directories"`
}

// onNotify routes a notify: policy topics to the update queue (§3.3),
// anything else to the data updater. It only enqueues.
func (a *Agent) onNotify(topic string, data json.RawMessage) {
	if !a.policyTopics[topic] {
		if d := a.dataUpdater(); d != nil {
			d.OnNotify(topic, data)
		}
		return
	}
	var m policyMessage
	if err := json.Unmarshal(data, &m); err != nil || m.OldPolicyHash == nil || m.NewPolicyHash == nil || m.ChangedDirectories == nil {
		// guard: mutation "m.ChangedDirectories == nil" -> "false" queues a message without dirs
		a.log.Warn("invalid policy update message ignored", "topic", topic, "bytes", len(data))
		return
	}
	// The queue keeps only the changed dirs that are subscription dirs;
	// a notify outside them asked for nothing.
	if a.queue.PolicyUpdate(*m.ChangedDirectories) { // guard: mutation "|| true" counts ignored notifies
		a.metrics.UpdateRequested("notification")
	}
}

func (a *Agent) onTransaction(tx updater.Transaction) {
	st := status.Transaction{
		ID: tx.ID, Type: tx.Type, Actions: tx.Actions, Success: tx.Success,
		Error: tx.Error, Created: tx.Created, Ended: tx.Ended,
	}
	a.tracker.Record(st)
	a.metrics.Transaction(tx.ID, tx.Success, tx.Ended)
	if a.ServerConnectivityDisabled() {
		// An operator trigger while disconnected fetches once; its failure
		// must not leave a deferred re-fetch behind. guard: mutation "if false {"
		a.sched.Cancel()
	}
	a.notifyBackup(tx.Success)
	if a.o.OnTransaction != nil {
		a.o.OnTransaction(st)
	}
}
