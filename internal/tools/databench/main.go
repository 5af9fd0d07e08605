// Command databench measures one large data update end to end: it starts
// the dev server, the agent (the real opal-client binary) and, for the
// external store, a real `opa run`; publishes one update of N entries
// (inline, or each fetching a URL of the dev server); and reports the time
// until every entry has landed, the agent's peak RSS (VmHWM) and the number
// of compiles (policy applies and health-check policy writes, from the
// agent's DEBUG log). docs/performance.md holds the figures and the command.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

func main() {
	agent := flag.String("agent", "bin/opal-client", "opal-client binary")
	devsrv := flag.String("devserver", "bin/opal-devserver", "opal-devserver binary")
	opa := flag.String("opa", "", "opa binary: external store (opa run); empty: the embedded OPA")
	n := flag.Int("entries", 3000, "entries in the update")
	kind := flag.String("kind", "inline", "inline, or url (each entry fetches a data source)")
	health := flag.Bool("health", true, "OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED")
	flag.Parse()
	if err := run(*agent, *devsrv, *opa, *n, *kind, *health); err != nil {
		fmt.Fprintln(os.Stderr, "databench:", err)
		os.Exit(1)
	}
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHTTP(url string, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not up", url)
}

func run(agentBin, devBin, opaBin string, n int, kind string, health bool) error {
	tmp, err := os.MkdirTemp("", "databench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	pol, data := filepath.Join(tmp, "policy", "rbac"), filepath.Join(tmp, "data")
	for _, d := range []string{pol, data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, f := range []string{"rbac.rego", "data.json"} {
		b, err := os.ReadFile(filepath.Join("examples/policy/rbac", f))
		if err != nil {
			return err
		}
		os.WriteFile(filepath.Join(pol, f), b, 0o644)
	}
	os.WriteFile(filepath.Join(data, "accounts.json"), []byte(`{"dave":{"roles":["viewer"]}}`), 0o644)

	const token = "bench-token"
	devAddr := freeAddr()
	dev := exec.Command(devBin, "-addr", devAddr, "-policy-dir", filepath.Join(tmp, "policy"), "-data-dir", data, "-token", token, "-poll", "0")
	dev.Stderr = io.Discard
	if err := dev.Start(); err != nil {
		return err
	}
	defer dev.Process.Kill()
	if err := waitHTTP("http://"+devAddr+"/data/config", 10*time.Second); err != nil {
		return err
	}

	apiAddr := freeAddr()
	_, apiPort, _ := net.SplitHostPort(apiAddr)
	env := append(os.Environ(),
		"OPAL_SERVER_URL=http://"+devAddr,
		"OPAL_CLIENT_TOKEN="+token,
		"OPAL_CLIENT_API_SERVER_PORT="+apiPort,
		"OPAL_DATA_UPDATER_ENABLED=true",
		"OPAL_LOG_LEVEL=DEBUG",
		"OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED="+strconv.FormatBool(health),
	)
	store := "embedded"
	if opaBin != "" {
		store = "opa run"
		opaAddr := freeAddr()
		o := exec.Command(opaBin, "run", "--server", "--addr", opaAddr, "--log-level", "error")
		if err := o.Start(); err != nil {
			return err
		}
		defer o.Process.Kill()
		if err := waitHTTP("http://"+opaAddr+"/health", 10*time.Second); err != nil {
			return err
		}
		env = append(env, "OPAL_INLINE_OPA_ENABLED=false", "OPAL_POLICY_STORE_URL=http://"+opaAddr)
	} else {
		env = append(env, `OPAL_INLINE_OPA_CONFIG={"addr":"`+freeAddr()+`"}`)
	}
	ag := exec.Command(agentBin, "run")
	ag.Env = env
	out, _ := ag.StderrPipe()
	ag.Stdout = ag.Stderr
	if err := ag.Start(); err != nil {
		return err
	}
	defer ag.Process.Kill()
	var compiles atomic.Int64
	compileLine := regexp.MustCompile(`msg="(policy updated|health-check policy written)"`)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if compileLine.MatchString(sc.Text()) {
				compiles.Add(1)
			}
		}
	}()
	metrics := "http://" + apiAddr + "/metrics"
	// Ready: the policy and the base data.
	if err := waitFor(metrics, 1, time.Minute); err != nil {
		return err
	}
	before := compiles.Load()

	var b bytes.Buffer
	b.WriteString(`{"id":"bench","entries":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if kind == "url" {
			fmt.Fprintf(&b, `{"url":"http://%s/data-sources/accounts.json","dst_path":"/bulk/e%d"}`, devAddr, i)
		} else {
			fmt.Fprintf(&b, `{"dst_path":"/bulk/e%d","data":{"i":%d}}`, i, i)
		}
	}
	b.WriteString(`]}`)
	start := time.Now()
	req, _ := http.NewRequest("POST", "http://"+devAddr+"/admin/data-update", &b)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("publish: %d %s", resp.StatusCode, body)
	}
	if err := waitFor(metrics, 1+n, 10*time.Minute); err != nil {
		return err
	}
	took := time.Since(start)
	// Let the coalesced health-policy write of the burst land.
	time.Sleep(500 * time.Millisecond)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", ag.Process.Pid))
	hwm := ""
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			hwm = strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:"))
		}
	}
	failed := metric(metrics, `opal_client_data_entries_total{outcome="fetch_failed"}`) + metric(metrics, `opal_client_data_entries_total{outcome="write_failed"}`)
	res := map[string]any{"store": store, "kind": kind, "entries": n, "landed": metric(metrics, `opal_client_data_entries_total{outcome="success"}`) - 1,
		"failed": failed, "seconds": took.Seconds(), "agent_peak_rss": hwm, "compiles": compiles.Load() - before}
	j, _ := json.Marshal(res)
	fmt.Println(string(j))
	return nil
}

// metric reads one sample of the agent's /metrics.
func metric(url, name string) int {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+" ") {
			f, _ := strconv.ParseFloat(strings.TrimPrefix(sc.Text(), name+" "), 64)
			return int(f)
		}
	}
	return 0
}

// waitFor polls until n data entries have been written successfully.
func waitFor(url string, n int, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if metric(url, `opal_client_data_entries_total{outcome="success"}`) >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%d entries not landed in %s (success=%d)", n, d, metric(url, `opal_client_data_entries_total{outcome="success"}`))
}
