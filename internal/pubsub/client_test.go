package pubsub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"
)

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name    string
		attempt int
		rnd     float64
		want    time.Duration
	}{
		// Mutation: `if attempt < 1 {` -> `if attempt < 0 {` (0<<... gives ceil=min).
		{"first_retry_floor_is_0.1s", 1, 0, 100 * ms},
		{"first_retry_ceiling_is_0.2s", 1, 1, 200 * ms},
		{"attempt_zero_is_first_retry", 0, 1, 200 * ms},
		// Jitter: a mid draw lands mid-range. Mutation: dropping rnd.
		{"full_jitter_mid_draw", 3, 0.5, 100*ms + 350*ms},
		{"doubles_per_attempt", 4, 1, 1600 * ms},
		// Mutation: `if c := MinBackoff << attempt; c < MaxBackoff {` -> `if c := MinBackoff << attempt; true {`.
		{"capped_at_120s", 11, 1, 120 * time.Second},
		// Mutation: `if attempt < 20 {` -> `if attempt < 200 {` (shift overflow).
		{"huge_attempt_saturates", 1 << 30, 1, 120 * time.Second},
		{"attempt_64_saturates", 64, 1, 120 * time.Second},
		// Mutation: `if !(rnd >= 0) {` -> `if false {`.
		{"nan_draw_is_floor", 5, math.NaN(), 100 * ms},
		{"negative_draw_is_floor", 5, -3, 100 * ms},
		// Mutation: `if rnd > 1 {` -> `if false {`.
		{"draw_above_one_is_ceiling", 2, 7, 400 * ms},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Backoff(tc.attempt, tc.rnd); got != tc.want {
				t.Fatalf("Backoff(%d, %v) = %v, want %v", tc.attempt, tc.rnd, got, tc.want)
			}
		})
	}
}

// TestProtocol_2_4_ConnectSequence pins the exact frames of §2.4 / §2.2:
// Bearer token in the handshake, _ping_ first, then one subscribe with all
// topics, both envelope keys written, 32-hex call ids.
func TestProtocol_2_4_ConnectSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		sc := <-p.conns
		id, ping := callID(t, sc.next(t))
		if want := `{"request":{"method":"_ping_","arguments":{},"call_id":"ID"},"response":null}`; ping != want {
			t.Fatalf("ping frame\n got %s\nwant %s", ping, want)
		}
		sc.send(t, `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"`+id+`"}}`)
		id, sub := callID(t, sc.next(t))
		if want := `{"request":{"method":"subscribe","arguments":{"topics":["policy:.","policy_data"]},"call_id":"ID"},"response":null}`; sub != want {
			t.Fatalf("subscribe frame\n got %s\nwant %s", sub, want)
		}
		synctest.Wait()
		if n := h.rec.connectsN(); n != 0 {
			t.Fatalf("OnConnect before subscribe answered: %d", n)
		}
		sc.send(t, `{"request":null,"response":{"result":true,"result_type":"bool","call_id":"`+id+`"}}`)
		synctest.Wait()
		if n := h.rec.connectsN(); n != 1 {
			t.Fatalf("connects = %d, want 1", n)
		}
		p.mu.Lock()
		auth := p.auth[0]
		p.mu.Unlock()
		if got := auth; got != "Bearer s3cret-token" {
			t.Fatalf("Authorization = %q (§2.1)", got)
		}
		if strings.Contains(h.logs.String(), "s3cret-token") {
			t.Fatal("token logged")
		}
		if err := h.stop(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
	})
}

// TestProtocol_2_4_PingUnansweredCarriesOn: a server that never answers
// _ping_ gets 5 tries of 1 s, then the subscribe anyway.
func TestProtocol_2_4_PingUnansweredCarriesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		sc := <-p.conns
		t0 := time.Now()
		for range 5 {
			if _, f := callID(t, sc.next(t)); !strings.Contains(f, `"_ping_"`) {
				t.Fatalf("want _ping_, got %s", f)
			}
		}
		if _, f := callID(t, sc.next(t)); !strings.Contains(f, `"subscribe"`) {
			t.Fatalf("want subscribe, got %s", f)
		}
		if d := time.Since(t0); d != 5*time.Second {
			t.Fatalf("subscribe after %v, want 5s (5 pings of 1s) after the first ping", d)
		}
		h.stop()
	})
}

// TestProtocol_2_3_GetChannelIDBeforeSubscribe: a statistics-enabled server
// asks _get_channel_id_ and only then answers subscribe; the client must
// answer it at once or hang.
func TestProtocol_2_3_GetChannelIDBeforeSubscribe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		sc := <-p.conns
		id, _ := callID(t, sc.next(t))
		sc.send(t, `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"`+id+`"}}`)
		subID, _ := callID(t, sc.next(t))
		sc.send(t, `{"request":{"method":"_get_channel_id_","arguments":{},"call_id":"00000000000000000000000000000abc"},"response":null}`)
		ans := string(sc.next(t))
		want := `^\{"request":null,"response":\{"result":"[0-9a-f]{32}","result_type":"str","call_id":"00000000000000000000000000000abc"\}\}$`
		if !regexpMatch(want, ans) {
			t.Fatalf("channel id answer %s", ans)
		}
		sc.send(t, `{"request":null,"response":{"result":true,"result_type":"bool","call_id":"`+subID+`"}}`)
		synctest.Wait()
		if h.rec.connectsN() != 1 {
			t.Fatal("not connected after subscribe")
		}
		h.stop()
	})
}

// TestProtocol_2_3_Frames: each frame the server may send, answered (or
// not) as §2.2/§2.3 say, without closing the connection. After each frame
// a _ping_ probe must get its pong: the connection survived.
func TestProtocol_2_3_Frames(t *testing.T) {
	const probe = `{"request":{"method":"_ping_","arguments":{},"call_id":"ffffffffffffffffffffffffffffffff"},"response":null}`
	const pong = `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"ffffffffffffffffffffffffffffffff"}}`
	big := strings.Repeat("x", 10<<20)
	cases := []struct {
		name      string
		send      func(sc *srvConn) error
		answer    string // the client's frame before the probe's pong, "" for none
		notifies  []string
		logSubstr string
	}{
		{
			// Mutation: `s.respond(r.CallID, "None")` -> `_ = 0`.
			name:     "2_3_notify_answered_None_after_enqueue",
			send:     text(`{"request":{"method":"notify","arguments":{"subscription":{"id":"e1","subscriber_id":"s","topic":"policy:.","notifier_id":null},"data":{"old_policy_hash":"a","new_policy_hash":"b","changed_directories":["."]}},"call_id":"0000000000000000000000000000000a"},"response":null}`),
			answer:   `{"request":null,"response":{"result":"None","result_type":"str","call_id":"0000000000000000000000000000000a"}}`,
			notifies: []string{`policy:. {"old_policy_hash":"a","new_policy_hash":"b","changed_directories":["."]}`},
		},
		{
			// Mutation: `if !s.topics[topic] {` -> `if false {`.
			name:      "2_5_notify_unsubscribed_topic_dropped_but_answered",
			send:      text(`{"request":{"method":"notify","arguments":{"subscription":{"topic":"policy:other"},"data":{}},"call_id":"0000000000000000000000000000000b"},"response":null}`),
			answer:    `{"request":null,"response":{"result":"None","result_type":"str","call_id":"0000000000000000000000000000000b"}}`,
			logSubstr: "not subscribed",
		},
		{
			name:      "2_2_notify_without_subscription_dropped",
			send:      text(`{"request":{"method":"notify","arguments":{"data":1},"call_id":"0000000000000000000000000000000c"},"response":null}`),
			answer:    `{"request":null,"response":{"result":"None","result_type":"str","call_id":"0000000000000000000000000000000c"}}`,
			logSubstr: "without subscription",
		},
		{
			name:     "2_2_missing_response_key_is_null",
			send:     text(`{"request":{"method":"notify","arguments":{"subscription":{"topic":"policy_data"},"data":null},"call_id":"0000000000000000000000000000000d"},"extra":1}`),
			answer:   `{"request":null,"response":{"result":"None","result_type":"str","call_id":"0000000000000000000000000000000d"}}`,
			notifies: []string{`policy_data null`},
		},
		{
			name:     "2_1_ten_megabyte_frame",
			send:     text(`{"request":{"method":"notify","arguments":{"subscription":{"topic":"policy_data"},"data":"` + big + `"},"call_id":"0000000000000000000000000000000e"},"response":null}`),
			answer:   `{"request":null,"response":{"result":"None","result_type":"str","call_id":"0000000000000000000000000000000e"}}`,
			notifies: []string{`policy_data "` + big + `"`},
		},
		{
			name:   "2_3_server_ping_answered_pong",
			send:   text(`{"request":{"method":"_ping_","arguments":{},"call_id":"00000000000000000000000000000001"},"response":null}`),
			answer: `{"request":null,"response":{"result":"pong","result_type":"str","call_id":"00000000000000000000000000000001"}}`,
		},
		{
			// Mutation: `s.c.log.Warn("pub/sub: dropping call to unknown method", "method", r.Method)` -> `s.respond(r.CallID, "x")`.
			name:      "2_2_unknown_method_dropped",
			send:      text(`{"request":{"method":"frobnicate","arguments":{},"call_id":"00000000000000000000000000000002"},"response":null}`),
			logSubstr: "unknown method",
		},
		{
			name: "2_2_unknown_call_id_ignored",
			send: text(`{"request":null,"response":{"result":true,"result_type":"bool","call_id":"99999999999999999999999999999999"}}`),
		},
		{
			// Mutation: `if mt != websocket.TextMessage {` -> `if false {`.
			name:      "2_1_binary_frame_dropped",
			send:      func(sc *srvConn) error { return sc.ws.WriteMessage(websocket.BinaryMessage, []byte(probe)) },
			logSubstr: "non-text frame",
		},
		{
			name:      "2_2_garbage_json_dropped",
			send:      text(`{"request": [1,2`),
			logSubstr: "malformed frame",
		},
		{
			// Mutation: `if m.Request == nil && m.Response == nil {` -> `if false {`.
			name:      "2_2_null_frame_dropped",
			send:      text(`null`),
			logSubstr: "neither request nor response",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newPeer(t)
				h := start(t, p, nil)
				sc := p.connect(t)
				if err := tc.send(sc); err != nil {
					t.Fatal(err)
				}
				sc.send(t, probe)
				if tc.answer != "" {
					if got := string(sc.next(t)); got != tc.answer {
						t.Fatalf("answer\n got %.300s\nwant %.300s", got, tc.answer)
					}
				}
				if got := string(sc.next(t)); got != pong {
					t.Fatalf("after the frame, got %.300s, want the probe's pong", got)
				}
				got := h.rec.notified()
				if len(got) != len(tc.notifies) || (len(got) > 0 && got[0] != tc.notifies[0]) {
					t.Fatalf("notifies = %.200q, want %.200q", got, tc.notifies)
				}
				if tc.logSubstr != "" && !strings.Contains(h.logs.String(), tc.logSubstr) {
					t.Fatalf("no log line containing %q", tc.logSubstr)
				}
				if n := len(p.dialTimes()); n != 1 {
					t.Fatalf("%d dials: the frame killed the connection", n)
				}
				h.stop()
			})
		})
	}
}

func text(s string) func(*srvConn) error {
	return func(sc *srvConn) error { return sc.ws.WriteMessage(websocket.TextMessage, []byte(s)) }
}

// TestProtocol_2_5_NotifyEnqueuedBeforeAnswer: OnNotify has run by the time
// the answer is on the wire.
func TestProtocol_2_5_NotifyEnqueuedBeforeAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		seen := make(chan int, 1)
		h := start(t, p, func(o *Options) {
			o.OnNotify = func(string, json.RawMessage) { seen <- 1 }
		})
		sc := p.connect(t)
		sc.send(t, `{"request":{"method":"notify","arguments":{"subscription":{"topic":"policy:."},"data":{}},"call_id":"0000000000000000000000000000000a"},"response":null}`)
		sc.next(t)
		select {
		case <-seen:
		default:
			t.Fatal("answer sent before OnNotify ran")
		}
		h.stop()
	})
}

// TestProtocol_2_7_ReconnectTriggersOncePerConnect: each (re)connect gives
// exactly one OnConnect, after subscribe, and OnState pairs up.
func TestProtocol_2_7_ReconnectTriggersOncePerConnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		for i := 1; i <= 4; i++ {
			sc := p.connect(t)
			synctest.Wait()
			if n := h.rec.connectsN(); n != i {
				t.Fatalf("after connect %d: %d connect triggers", i, n)
			}
			sc.ws.Close() // the server drops the socket
		}
		synctest.Wait()
		h.stop()
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		if got, want := fmt.Sprint(h.rec.states), "[true false true false true false true false]"; got != want {
			t.Fatalf("states = %v, want %v", h.rec.states, want)
		}
	})
}

// TestReadTimeout_DeadPeer: a peer that goes silent (reads nothing, sends
// nothing) is closed after ReadTimeout and the client reconnects.
func TestReadTimeout_DeadPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, func(o *Options) {
			o.PingInterval = 5 * time.Second
			o.ReadTimeout = 12 * time.Second
		})
		sc := p.connect(t)
		// A live peer answering pings stays connected well past ReadTimeout.
		time.Sleep(time.Minute) // virtual time: drives the client's timers
		if n := len(p.dialTimes()); n != 1 {
			t.Fatalf("live peer dropped: %d dials", n)
		}
		// Stop the pump: the peer goes silent, answering nothing.
		_ = sc.ws.UnderlyingConn().SetReadDeadline(time.Now())
		t0 := time.Now()
		// Mutation: watchdog `s.conn.Close() // ends the reader, and so the session` -> `_ = 0`.
		var next *srvConn
		select {
		case next = <-p.conns: // the reconnect
		case <-time.After(12*time.Second + DefaultReconnectSpread + time.Millisecond): // virtual time; the reconnect is spread
			t.Fatal("dead peer not detected within ReadTimeout + backoff")
		}
		// The last pong may predate t0 by up to one PingInterval.
		if d := time.Since(t0); d < 12*time.Second-5*time.Second {
			t.Errorf("reconnected after %v, before ReadTimeout", d)
		}
		if !strings.Contains(h.logs.String(), "peer silent") {
			t.Fatal("no log of the silent peer")
		}
		next.ws.Close()
		h.stop()
	})
}

// TestProtocol_2_7_RefusedHandshakeBacksOff: 403 (bad token) is retried
// with growing, jittered waits on the injected clock, never a hot loop.
func TestProtocol_2_7_RefusedHandshakeBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		p.setRefuse(403)
		draws := []float64{0.9, 0.1, 0.7, 0.3, 0.5, 0.95, 0.2}
		i := 0
		h := start(t, p, func(o *Options) {
			o.Rand = func() float64 { d := draws[i%len(draws)]; i++; return d }
		})
		time.Sleep(20 * time.Second)
		p.setRefuse(0)
		sc := p.connect(t)
		dials := p.dialTimes()
		if len(dials) < 6 {
			t.Fatalf("only %d attempts in 20s", len(dials))
		}
		for n := 1; n < len(dials)-1; n++ {
			got := dials[n].Sub(dials[n-1])
			r := draws[(n-1)%len(draws)]
			if want := Backoff(n, r); got != want {
				t.Fatalf("wait before attempt %d = %v, want Backoff(%d, %v) = %v", n+1, got, n, r, want)
			}
		}
		if !strings.Contains(h.logs.String(), "status=403") {
			t.Fatal("refusal not logged with its status")
		}
		sc.ws.Close()
		h.stop()
	})
}

// TestProtocol_2_7_BackoffResetsAfterStableConnection: a connection that
// stayed up StableAfter ends with a fresh schedule (the spread window); a
// short-lived one after failures keeps growing it, within the cap.
func TestProtocol_2_7_BackoffResetsAfterStableConnection(t *testing.T) {
	cases := []struct {
		name string
		up   time.Duration
		want time.Duration
	}{
		// A stable connection's end: the spread window (draw 1: its top).
		// Mutation: the stable test dropped (a flapping-style 55 s wait).
		{"stable_connection_resets", 31 * time.Second, DefaultReconnectSpread},
		// A short connection after failures (flapping) keeps growing: the
		// fifth failure's step is capped at the 55 s maximum wait.
		// Mutation: every connection treated as stable (the 15 s window).
		{"short_connection_keeps_growing", time.Second, DefaultReconnectMaxWait},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := newPeer(t)
				p.setRefuse(403)
				h := start(t, p, func(o *Options) { o.Rand = func() float64 { return 1 } })
				for len(p.dialTimes()) < 4 { // 4 refusals: the next wait is attempt 4, then 5
					time.Sleep(100 * time.Millisecond)
				}
				p.setRefuse(0)
				sc := p.connect(t)
				time.Sleep(tc.up)
				sc.ws.Close()
				t0 := time.Now()
				sc = <-p.conns
				if got := time.Since(t0); got != tc.want {
					t.Fatalf("reconnect after %v, want %v", got, tc.want)
				}
				sc.ws.Close()
				h.stop()
			})
		})
	}
}

// TestRun_CancelClosesCleanly: Run returns on cancel with a normal-closure
// close frame to the server.
func TestRun_CancelClosesCleanly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, nil)
		sc := p.connect(t)
		if err := h.stop(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		for range sc.frames {
		}
		if err := sc.err; !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Fatalf("server saw %v, want close 1000", err)
		}
	})
}

// TestProtocol_2_6_KeepAlive sends RPC _ping_ every KeepAlive.
func TestProtocol_2_6_KeepAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		h := start(t, p, func(o *Options) { o.KeepAlive = 7 * time.Second })
		sc := p.connect(t)
		t0 := time.Now()
		for k := 1; k <= 2; k++ {
			_, f := callID(t, sc.next(t))
			if f != `{"request":{"method":"_ping_","arguments":{},"call_id":"ID"},"response":null}` {
				t.Fatalf("keep-alive frame %s", f)
			}
			if d := time.Since(t0); d != time.Duration(k)*7*time.Second {
				t.Fatalf("keep-alive %d at %v", k, d)
			}
		}
		h.stop()
	})
}

// TestShutdown_SilentHandshakeServer (§6 shutdown on SIGTERM): a server
// that accepts TCP but never answers the upgrade must not hold a cancelled
// Run until the 30 s handshake timeout. Mutation: the AfterFunc watch that
// closes the socket on ctx.Done is dropped.
func TestShutdown_SilentHandshakeServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		p.silent = true
		h := start(t, p, nil)
		synctest.Wait()
		if n := len(p.dialTimes()); n != 1 {
			t.Fatalf("dials = %d, want 1 (upgrade sent)", n)
		}
		t0 := time.Now()
		if err := h.stop(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		if d := time.Since(t0); d != 0 {
			t.Fatalf("Run returned %v after cancel, want at once", d)
		}
	})
}

// The reconnect schedule (Reconnect.Next): a spread first reconnect after a
// drop, growth from the spread capped at the maximum wait, a capped start-up
// backoff, and a refused handshake's Retry-After honoured under the cap.
func TestReconnectSchedule(t *testing.T) {
	const s = time.Second
	drop := func(r *Reconnect) { r.Next(time.Hour, errors.New("dropped")) }
	refused := func(status int, ra time.Duration) error {
		return &HandshakeError{Status: status, RetryAfter: ra, HasRetryAfter: ra > 0}
	}
	cases := []struct {
		name  string
		draw  float64
		setup func(*Reconnect)
		up    time.Duration
		err   error
		want  time.Duration
	}{
		// Mutation: the spread dropped (the first reconnect at MinBackoff).
		{"drop_spread_top", 1, nil, time.Hour, errors.New("dropped"), 15 * s},
		{"drop_spread_floor", 0, nil, time.Hour, errors.New("dropped"), MinBackoff},
		// Failures after a drop grow from the spread: 15 s, 30 s, then the cap.
		{"first_failure_after_drop", 1, drop, 0, errors.New("refused"), 15 * s},
		{"first_failure_after_drop_narrow_floor", 0, drop, 0, errors.New("refused"), 13500 * time.Millisecond},
		{"third_failure_capped", 1, func(r *Reconnect) { drop(r); r.Next(0, nil); r.Next(0, nil) }, 0, errors.New("refused"), 55 * s},
		// The first capped wait (third failure) spans the whole cap; the
		// next ones stay within [0.9 cap, cap].
		{"first_capped_wait_full", 0, func(r *Reconnect) { drop(r); r.Next(0, nil); r.Next(0, nil) }, 0, errors.New("refused"), MinBackoff},
		{"later_capped_wait_narrow", 0, func(r *Reconnect) { drop(r); r.Next(0, nil); r.Next(0, nil); r.Next(0, nil) }, 0, errors.New("refused"), 49500 * time.Millisecond},
		// Mutation: the start-up backoff not capped (120 s).
		{"startup_capped_at_max_wait", 1, func(r *Reconnect) {
			for range 30 {
				r.Next(0, nil)
			}
		}, 0, errors.New("refused"), 55 * s},
		{"startup_first_retry_quick", 1, nil, 0, errors.New("refused"), 200 * time.Millisecond},
		// Mutation: the handshake's Retry-After ignored.
		{"retry_after_honoured", 0, nil, 0, refused(503, 30*s), 30 * s},
		{"retry_after_spread_upward", 1, nil, 0, refused(429, 20*s), 40 * s},
		// Mutation: the hint not capped.
		{"retry_after_capped", 0, nil, 0, refused(503, 99999*s), 60 * s},
		{"no_hint_on_403", 0, nil, 0, &HandshakeError{Status: 403}, MinBackoff},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReconnect(Options{MaxRetryAfter: 60 * s, Rand: func() float64 { return tc.draw }})
			if tc.setup != nil {
				tc.setup(r)
			}
			if got := r.Next(tc.up, tc.err); got != tc.want {
				t.Fatalf("Next = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("retry_after_off_when_cap_zero", func(t *testing.T) {
		r := NewReconnect(Options{Rand: func() float64 { return 0 }})
		if got := r.Next(0, refused(503, 30*s)); got != MinBackoff {
			t.Fatalf("Next = %v, want %v: MaxRetryAfter 0 honours no hint", got, MinBackoff)
		}
	})
}

// A refused handshake's Retry-After reaches the schedule: the client's next
// attempt comes no earlier than the hint (503 with Retry-After: 8).
func TestProtocol_2_7_RefusedHandshakeHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPeer(t)
		p.setRefuse(503)
		p.mu.Lock()
		p.retryAfter = "8"
		p.mu.Unlock()
		h := start(t, p, func(o *Options) {
			o.Rand = func() float64 { return 0 }
			o.MaxRetryAfter = time.Minute
		})
		time.Sleep(30 * time.Second)
		dials := p.dialTimes()
		if len(dials) < 2 {
			t.Fatalf("%d attempts in 30 s", len(dials))
		}
		for i := 1; i < len(dials); i++ {
			// Mutation: the header not parsed (0.1 s, 0.2 s... waits).
			if gap := dials[i].Sub(dials[i-1]); gap < 8*time.Second {
				t.Fatalf("attempt %d came %v after the one refused with Retry-After: 8", i+1, gap)
			}
		}
		h.stop()
	})
}
