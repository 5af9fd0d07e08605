package embedded

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/opal-go/opal-client/fetcher"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// genBundle is 1,000 policy modules and about 10 MB of data in 100 data.json files.
func genBundle() *fetcher.PolicyBundle {
	pol := map[string]string{}
	for i := range 1000 {
		pol[fmt.Sprintf("gen/m%04d/policy.rego", i)] = fmt.Sprintf(
			"package gen.m%04d\n\ndefault allow := false\n\nallow if {\n\tinput.user == %q\n\tsome r in data.d%02d.records\n\tr.owner == input.user\n}\n\nnames contains r.name if some r in data.d%02d.records\n",
			i, fmt.Sprintf("user%d", i), i%100, i%100)
	}
	data := map[string]string{}
	for d := range 100 {
		var b strings.Builder
		b.WriteString(`{"records":[`)
		for r := 0; b.Len() < 100_000; r++ {
			if r > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"rec-%d-%d","owner":"user%d","tags":["a","b","c"],"n":%d}`, d, r, r%1000, r)
		}
		b.WriteString("]}")
		data[fmt.Sprintf("d%02d", d)] = b.String()
	}
	return st.Full("full", pol, data)
}

// opaActivate is OPA's own bundle activation of the same content into an
// in-memory store: parse the modules, decode the data, Activate, commit. The
// compiler is returned too: an OPA serving decisions keeps it, as ours does.
func opaActivate(b *fetcher.PolicyBundle) (storage.Store, *ast.Compiler, error) {
	ctx := context.Background()
	ob := &bundle.Bundle{Data: map[string]any{}}
	for _, m := range b.PolicyModules {
		parsed, err := ast.ParseModuleWithOpts(m.Path, m.Rego, ast.ParserOptions{})
		if err != nil {
			return nil, nil, err
		}
		ob.Modules = append(ob.Modules, bundle.ModuleFile{Path: m.Path, URL: m.Path, Raw: []byte(m.Rego), Parsed: parsed})
	}
	for _, d := range b.DataModules {
		var v any
		if err := json.Unmarshal([]byte(d.Data), &v); err != nil {
			return nil, nil, err
		}
		ob.Data[d.Path] = v
	}
	ob.Manifest.Init()
	s := inmem.NewWithOpts(inmem.OptRoundTripOnWrite(false))
	txn, err := s.NewTransaction(ctx, storage.WriteParams)
	if err != nil {
		return nil, nil, err
	}
	c := ast.NewCompiler()
	err = bundle.Activate(&bundle.ActivateOpts{
		Ctx: ctx, Store: s, Txn: txn, TxnCtx: storage.NewContext(),
		Compiler: c, Metrics: metrics.New(),
		Bundles: map[string]*bundle.Bundle{"opal": ob},
	})
	if err != nil {
		s.Abort(ctx, txn)
		return nil, nil, err
	}
	return s, c, s.Commit(ctx, txn)
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// TestPerformanceReport prints the figures recorded in docs/performance.md.
// Run: OPAL_PERF=1 go test -run TestPerformanceReport -v ./internal/store/embedded
func TestPerformanceReport(t *testing.T) {
	if os.Getenv("OPAL_PERF") == "" {
		t.Skip("set OPAL_PERF=1 to run the store benchmark")
	}
	ctx := context.Background()
	var b *fetcher.PolicyBundle
	const runs = 5
	var ours, theirs, delta []time.Duration
	var ourHeap, theirHeap uint64
	for i := range runs {
		b = genBundle() // an apply consumes the bundle's data text
		h0 := heap()
		t0 := time.Now()
		ostore, oc, err := opaActivate(b)
		if err != nil {
			t.Fatal(err)
		}
		theirs = append(theirs, time.Since(t0))
		if i == 0 {
			theirHeap = heap() - h0
		}
		runtime.KeepAlive(ostore)
		runtime.KeepAlive(oc)
		ostore, oc = nil, nil

		h0 = heap()
		s, err := New(ctx, Options{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t0 = time.Now()
		if err := s.ApplyPolicy(ctx, b); err != nil {
			t.Fatal(err)
		}
		ours = append(ours, time.Since(t0))
		if i == 0 {
			ourHeap = heap() - h0
		}
		d := st.Delta("full", "delta", map[string]string{"gen/m0000/policy.rego": "package gen.m0000\n\ndefault allow := true\n"}, nil, nil, nil)
		t0 = time.Now()
		if err := s.ApplyPolicy(ctx, d); err != nil {
			t.Fatal(err)
		}
		delta = append(delta, time.Since(t0))
		o := st.OPA{T: t, Base: "http://" + s.Addr()}
		if got := o.Get("/v1/data/gen/m0000/allow"); got != `{"result":true}` {
			t.Fatalf("delta not visible: %s", got)
		}
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mo, mt := median(ours), median(theirs)
	b = genBundle()
	t.Logf("bundle: %d modules, %d data modules, %.1f MB data JSON", len(b.PolicyModules), len(b.DataModules), float64(dataSize(b))/1e6)
	t.Logf("full apply (embedded store)   median %v", mo)
	t.Logf("OPA bundle.Activate (inmem)   median %v", mt)
	t.Logf("time ratio embedded/OPA       %.2fx", float64(mo)/float64(mt))
	t.Logf("one-module delta (embedded)   median %v", median(delta))
	t.Logf("heap held: embedded %.1f MB, OPA activation %.1f MB, ratio %.2fx",
		float64(ourHeap)/1e6, float64(theirHeap)/1e6, float64(ourHeap)/float64(theirHeap))
}

func dataSize(b *fetcher.PolicyBundle) int {
	n := 0
	for _, d := range b.DataModules {
		n += len(d.Data)
	}
	return n
}
