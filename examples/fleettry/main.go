// Command fleettry tries the agent's fleet and outage behaviour as a new
// user would: the built opal-client binary (embedded OPA, defaults) against
// the built dev server on loopback, with faults set through the dev
// server's admin routes (docs/devserver.md). It reports what it saw beside
// the figure each try must meet (docs/performance.md, "Tried by hand"); it
// judges nothing itself and exits non-zero only when a try cannot run.
//
//	go run ./examples/fleettry            # every try, about 4 minutes
//	go run ./examples/fleettry -try stall # one of: restart, retry-after, zero-wait, stall
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/opal-go/opal-client/internal/tools/child"
)

func main() {
	try := flag.String("try", "all", "restart, retry-after, zero-wait, stall or all")
	agents := flag.Int("agents", 40, "agents in the restart try")
	flag.Parse()
	if err := run(*try, *agents); err != nil {
		fmt.Fprintln(os.Stderr, "fleettry:", err)
		os.Exit(1)
	}
}

// record is one line of the dev server's request log.
type record struct {
	Time   time.Time
	Path   string
	Status int
}

type rig struct {
	dir, client, devserver string
	procs                  []*proc
	server                 string // base URL of the dev server
}

// proc is a started process; done is closed when it has exited.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func run(try string, agents int) error {
	dir, err := os.MkdirTemp("", "fleettry")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r := &rig{dir: dir, client: filepath.Join(dir, "opal-client"), devserver: filepath.Join(dir, "opal-devserver")}
	for bin, pkg := range map[string]string{r.client: "./cmd/opal-client", r.devserver: "./cmd/opal-devserver"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s (run from the repository root): %v\n%s", pkg, err, out)
		}
	}
	tries := map[string]func(*rig) error{
		"restart":     func(r *rig) error { return r.restart(agents) },
		"retry-after": (*rig).retryAfter,
		"zero-wait":   (*rig).zeroWait,
		"stall":       (*rig).stall,
	}
	names := []string{"restart", "retry-after", "zero-wait", "stall"}
	if try != "all" {
		if tries[try] == nil {
			return fmt.Errorf("-try %q: want one of %v or all", try, names)
		}
		names = []string{try}
	}
	for _, n := range names {
		err := func() error {
			defer r.stopAll()
			if err := r.startServer(); err != nil {
				return err
			}
			return tries[n](r)
		}()
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// restart: agents that hold a policy, then every socket dropped with the
// server healthy at once. Done when no one-second window holds more than a
// fifth of the reconnects or a tenth of the resync fetches, all within 40 s.
func (r *rig) restart(n int) error {
	for i := range n {
		if _, err := r.startAgent(i); err != nil {
			return err
		}
	}
	held := 0
	if err := r.waitFor(90*time.Second, func(recs []record) bool { held = count(recs, "/policy", 200); return held >= n }); err != nil {
		return fmt.Errorf("start-up: %d of %d agents fetched a policy: %w%s", held, n, err, r.exited())
	}
	time.Sleep(2 * time.Second) // the start-up's data loads
	if err := r.admin("/admin/drop-sockets", ""); err != nil {
		return err
	}
	time.Sleep(100 * time.Second)
	recs, err := r.requests()
	if err != nil {
		return err
	}
	var drop time.Time
	var ws, pol []time.Time
	for _, rec := range recs {
		switch {
		case rec.Path == "/admin/drop-sockets":
			drop = rec.Time
		case drop.IsZero():
		case rec.Path == "/ws" && rec.Status == http.StatusSwitchingProtocols:
			ws = append(ws, rec.Time)
		case rec.Path == "/policy":
			pol = append(pol, rec.Time)
		}
	}
	last := func(ts []time.Time) time.Duration {
		if len(ts) == 0 {
			return -1
		}
		return slices.MaxFunc(ts, time.Time.Compare).Sub(drop)
	}
	fmt.Printf("restart, %d agents: %d reconnects, at most %d in one second (bound %d), the last %.1f s after the drop\n",
		n, len(ws), window(ws), n/5, last(ws).Seconds())
	fmt.Printf("  %d resync fetches, at most %d in one second (bound %d), the last %.1f s after the drop (target 40 s)\n",
		len(pol), window(pol), n/10, last(pol).Seconds())
	return nil
}

// retry-after: 503 with Retry-After: 8 and one attempt per fetch. No two
// requests may come less than 8 s apart.
func (r *rig) retryAfter() error {
	if err := r.admin("/admin/script", `{"path":"/policy","answers":[{"status":503,"headers":{"Retry-After":"8"},"body":"{\"detail\":\"cloning\"}","count":1000}]}`); err != nil {
		return err
	}
	if _, err := r.startAgent(0, `OPAL_POLICY_UPDATER_CONN_RETRY={"wait_strategy":"fixed","wait_time":1,"attempts":1}`); err != nil {
		return err
	}
	time.Sleep(75 * time.Second)
	ts, err := r.policyTimes()
	if err != nil {
		return err
	}
	shortest := time.Duration(-1)
	for i := 1; i < len(ts); i++ {
		if g := ts[i].Sub(ts[i-1]); shortest < 0 || g < shortest {
			shortest = g
		}
	}
	fmt.Printf("retry-after 8, one attempt per fetch: %d requests in 75 s, the shortest gap %.1f s (bound 8 s)\n", len(ts), shortest.Seconds())
	return nil
}

// zero-wait: the zero-wait configuration against a 503: at most 30
// requests in 3 s, or refused at start.
func (r *rig) zeroWait() error {
	if err := r.admin("/admin/script", `{"path":"/policy","answers":[{"status":503,"count":10000}]}`); err != nil {
		return err
	}
	if _, err := r.startAgent(0, `OPAL_POLICY_UPDATER_CONN_RETRY={"wait_strategy":"fixed","wait_time":0,"attempts":5000}`); err != nil {
		return err
	}
	time.Sleep(6 * time.Second)
	ts, err := r.policyTimes()
	if err != nil || len(ts) == 0 {
		return errors.Join(err, fmt.Errorf("no policy request (an agent that refuses the config at start is as good)%s", r.exited()))
	}
	in3 := 0
	for _, t := range ts {
		if t.Sub(ts[0]) <= 3*time.Second {
			in3++
		}
	}
	fmt.Printf("zero-wait config against a 503: %d requests in the first 3 s (bound 30)\n", in3)
	return nil
}

// stall: headers, then a body that never comes. The fetch must release the
// queue within B plus one attempt's timeout; with a 5 s attempt timeout and
// a 10 s MAX_RETRY_AFTER, B is the CONN_RETRY worst case of 15 s: 20 s.
func (r *rig) stall() error {
	if err := r.admin("/admin/script", `{"path":"/policy","answers":[{"status":200,"headers":{"Content-Length":"100000"},"body":"{\"manifest\":[","stall":true,"count":100}]}`); err != nil {
		return err
	}
	log, err := r.startAgent(0, "OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT=5", "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER=10")
	if err != nil {
		return err
	}
	time.Sleep(30 * time.Second)
	b, _ := os.ReadFile(log)
	m := regexp.MustCompile(`msg="fetch failed".* attempts=(\d+) elapsed=(\S+)`).FindSubmatch(b)
	if m == nil {
		return fmt.Errorf("no failed fetch logged in 30 s:\n%s", b)
	}
	fmt.Printf("stalled body: the fetch ended after %s attempts and %s (bound B + one timeout = 20 s)\n", m[1], m[2])
	return nil
}

// window is the most times in any one-second window.
func window(ts []time.Time) int {
	s := slices.Clone(ts)
	slices.SortFunc(s, time.Time.Compare)
	most, j := 0, 0
	for i := range s {
		for s[i].Sub(s[j]) > time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

func count(recs []record, path string, status int) int {
	n := 0
	for _, r := range recs {
		if r.Path == path && r.Status == status {
			n++
		}
	}
	return n
}

func (r *rig) startServer() error {
	port, err := child.FreePorts(1)
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + port[0]
	cmd := exec.Command(r.devserver, "-addr", addr, "-policy-dir", "examples/policy")
	if err := r.start(cmd, "devserver.log"); err != nil {
		return err
	}
	r.server = "http://" + addr
	return r.waitFor(10*time.Second, func([]record) bool { return true })
}

// startAgent starts agent i at the defaults plus env, with its own ports
// and backup file, and returns the path of its log.
func (r *rig) startAgent(i int, env ...string) (string, error) {
	ports, err := child.FreePorts(2) // the agent's API and its OPA
	if err != nil {
		return "", err
	}
	cmd := exec.Command(r.client, "run")
	cmd.Env = child.Env(append([]string{"OPAL_SERVER_URL=" + r.server, "UVICORN_PORT=" + ports[0],
		`OPAL_INLINE_OPA_CONFIG={"addr":"127.0.0.1:` + ports[1] + `"}`,
		"OPAL_STORE_BACKUP_PATH=" + filepath.Join(r.dir, fmt.Sprintf("backup-%d.json", i))}, env...)...)
	log := fmt.Sprintf("agent-%d.log", i)
	return filepath.Join(r.dir, log), r.start(cmd, log)
}

func (r *rig) start(cmd *exec.Cmd, log string) error {
	path := filepath.Join(r.dir, log)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	p := &proc{cmd: cmd, log: path, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	r.procs = append(r.procs, p)
	return nil
}

// exited names the processes that have exited, with the end of their logs.
func (r *rig) exited() string {
	var b strings.Builder
	for _, p := range r.procs {
		select {
		case <-p.done:
			out, _ := os.ReadFile(p.log)
			fmt.Fprintf(&b, "\n%s exited: %s", filepath.Base(p.log), out[max(0, len(out)-400):])
		default:
		}
	}
	return b.String()
}

func (r *rig) stopAll() {
	for _, p := range slices.Backward(r.procs) {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	r.procs = nil
}

func (r *rig) admin(path, body string) error {
	resp, err := http.Post(r.server+path, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", path, resp.Status)
	}
	return nil
}

func (r *rig) requests() ([]record, error) {
	resp, err := http.Get(r.server + "/admin/requests")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var recs []record
	return recs, json.NewDecoder(resp.Body).Decode(&recs)
}

func (r *rig) policyTimes() ([]time.Time, error) {
	recs, err := r.requests()
	var ts []time.Time
	for _, rec := range recs {
		if rec.Path == "/policy" {
			ts = append(ts, rec.Time)
		}
	}
	return ts, err
}

// waitFor polls the request log until ok holds or d passes.
func (r *rig) waitFor(d time.Duration, ok func([]record) bool) error {
	end := time.Now().Add(d)
	for {
		recs, err := r.requests()
		if err == nil && ok(recs) {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("not ready within %s (last error: %v)", d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
