package pubsub

import (
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// statsConnect plays a statistics server's side of §2.3/§2.4 on the next
// socket: pong, then _get_channel_id_ before answering subscribe. It returns
// the socket and the channel id the client gave.
func statsConnect(t *testing.T, p *peer) (*srvConn, string) {
	t.Helper()
	sc := <-p.conns
	id, _ := callID(t, sc.next(t)) // _ping_
	sc.send(t, `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"`+id+`"}}`)
	subID, _ := callID(t, sc.next(t)) // subscribe
	sc.send(t, `{"request":{"method":"_get_channel_id_","arguments":{},"call_id":"00000000000000000000000000000abc"},"response":null}`)
	m := regexp.MustCompile(`"result":"([0-9a-f]{32})"`).FindSubmatch(sc.next(t))
	if m == nil {
		t.Fatal("no channel id answer")
	}
	sc.send(t, `{"request":null,"response":{"result":true,"result_type":"bool","call_id":"`+subID+`"}}`)
	return sc, string(m[1])
}

// nextWithin is sc.next bounded on the bubble's virtual clock: a client that
// stays silent fails the test at once instead of ticking pings forever.
func nextWithin(t *testing.T, sc *srvConn, d time.Duration) []byte {
	t.Helper()
	select {
	case f, ok := <-sc.frames:
		if !ok {
			t.Fatal("client socket closed, wanted a frame")
		}
		return f.data
	case <-time.After(d):
		t.Fatalf("no frame from the client within %v", d)
		return nil
	}
}

// TestStatistics_AnnouncedAfterSubscribe pins the frame the Python client
// sends with OPAL_STATISTICS_ENABLED: after subscribe, one publish to the
// statistics channel of its topics, its client id and its channel id.
// Mutation: `if c.o.Statistics != nil {` -> `if c.o.Statistics == nil {`.
func TestStatistics_AnnouncedAfterSubscribe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, func(o *Options) { o.Statistics = &Statistics{ClientID: "CLIENT_test"} })
		sc, chanID := statsConnect(t, p)
		id, pub := callID(t, nextWithin(t, sc, 10*time.Second))
		want := `{"request":{"method":"publish","arguments":{"topics":["__opal_stats_add"],"data":{"topics":["policy:.","policy_data"],"client_id":"CLIENT_test","rpc_id":"` +
			chanID + `"},"sync":true,"notifier_id":null},"call_id":"ID"},"response":null}`
		if pub != want {
			t.Fatalf("statistics frame\n got %s\nwant %s", pub, want)
		}
		sc.send(t, `{"request":null,"response":{"result":true,"result_type":"bool","call_id":"`+id+`"}}`)
		synctest.Wait()
		if n := len(sc.frames); n != 0 {
			t.Fatalf("%d more frames after the announcement, want none", n)
		}
		h.stop()
	})
}

// TestStatistics_OffByDefault: without Statistics nothing is published.
func TestStatistics_OffByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		sc, _ := statsConnect(t, p)
		synctest.Wait()
		if n := len(sc.frames); n != 0 {
			t.Fatalf("%d frames after subscribe without statistics: %s", n, sc.next(t))
		}
		h.stop()
	})
}

// TestStatistics_EveryConnectSameClientID: each reconnect announces again,
// with that connection's channel id and the client id drawn once (the
// Python client draws CLIENT_<uuid hex> once per process).
// Mutation: `c.ClientID = NewClientStatID()` -> `c.ClientID = ""`.
func TestStatistics_EveryConnectSameClientID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, func(o *Options) { o.Statistics = &Statistics{} })
		re := regexp.MustCompile(`"client_id":"([^"]*)","rpc_id":"([0-9a-f]{32})"`)
		var ids, chans []string
		for range 2 {
			sc, chanID := statsConnect(t, p)
			m := re.FindStringSubmatch(string(nextWithin(t, sc, 10*time.Second)))
			if m == nil || m[2] != chanID {
				t.Fatalf("announcement %v, channel id %s", m, chanID)
			}
			ids, chans = append(ids, m[1]), append(chans, m[2])
			sc.ws.Close()
		}
		h.stop()
		if !regexp.MustCompile(`^CLIENT_[0-9a-f]{32}$`).MatchString(ids[0]) || ids[0] != ids[1] {
			t.Fatalf("client ids %v: want one CLIENT_<32 hex> for both connections", ids)
		}
		if chans[0] == chans[1] {
			t.Fatalf("both connections announced channel id %s", chans[0])
		}
	})
}

// TestStatistics_UnansweredKeepsTheConnection: a server that never answers
// the publish costs a warning after SubscribeTimeout, not the subscription.
func TestStatistics_UnansweredKeepsTheConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, func(o *Options) {
			o.Statistics = &Statistics{ClientID: "c"}
			o.SubscribeTimeout = 5 * time.Second
		})
		sc, _ := statsConnect(t, p)
		sc.next(t)                  // the publish, left unanswered
		time.Sleep(6 * time.Second) // virtual time: past SubscribeTimeout
		synctest.Wait()
		sc.send(t, `{"request":{"method":"_ping_","arguments":{},"call_id":"00000000000000000000000000000def"},"response":null}`)
		if ans := string(sc.next(t)); !strings.Contains(ans, `"result":"pong"`) {
			t.Fatalf("after the unanswered publish: %s", ans)
		}
		h.stop()
		if !strings.Contains(h.logs.String(), "statistics announcement not answered") || h.rec.connectsN() != 1 {
			t.Fatalf("connects %d, logs:\n%s", h.rec.connectsN(), h.logs.String())
		}
	})
}
