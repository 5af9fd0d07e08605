package oparest

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	st "github.com/opal-go/opal-client/internal/store/storetest"
	"github.com/opal-go/opal-client/internal/testutil"
)

// startOPARun starts a real `opa run --server` on a free loopback port and
// returns its base URL once GET /health answers 200. It is stopped by its
// PID when the test ends.
func startOPARun(t *testing.T) string {
	t.Helper()
	bin := testutil.OPABinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // another process may take it first: then OPA fails loudly below
	cmd := exec.Command(bin, "run", "--server", "--addr", addr, "--disable-telemetry", "--log-level", "error")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := "http://" + addr
	hc := &http.Client{Timeout: time.Second}
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := hc.Get(base + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("opa run exited before it was ready: %v", err)
		case <-deadline:
			t.Fatal("opa run not ready after 30 s")
		case <-tick.C:
		}
	}
}

// Against a real `opa run`: bundle data numbers reach OPA with every digit
// (the PUT body is encoded from json.Number). Mutation caught: drop
// dec.UseNumber() in store.DecodeData.
func TestBundleDataNumbersExactInOPARun(t *testing.T) {
	base := startOPARun(t)
	for _, tc := range []struct {
		name, dir, data, path, want string
	}{
		{"bundle_int_above_2pow53_exact", "nums", `{"n": 9007199254740993}`, "/v1/data/nums/n", `{"result":9007199254740993}`},
		{"bundle_root_int_above_2pow53_exact", ".", `{"big": {"n": 18446744073709551617}}`, "/v1/data/big/n", `{"result":18446744073709551617}`},
		{"bundle_decimal_digits_exact", "dec", `{"d": 0.10000000000000000555}`, "/v1/data/dec/d", `{"result":0.10000000000000000555}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Options{URL: base, Wait: func(int) time.Duration { return 0 }})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.ApplyPolicy(context.Background(), st.Full("h-"+tc.name, map[string]string{"p.rego": "package p\n\nx := 1\n"},
				map[string]string{tc.dir: tc.data})); err != nil {
				t.Fatal(err)
			}
			o := st.OPA{T: t, Base: base}
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("GET %s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
}
