// Package storetest holds helpers the store tests share: bundle builders and
// a small client for OPA's REST API.
package storetest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/dataupdater"
)

// Value decodes JSON text the way the data updater does (numbers as
// json.Number), for the value of a data write.
func Value(t *testing.T, s string) any {
	t.Helper()
	v, err := dataupdater.ApplyPatch(nil, Patch(t, `[{"op":"add","path":"","value":`+s+`}]`))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Patch decodes a JSON-Patch document for a data write.
func Patch(t *testing.T, s string) []dataupdater.PatchOp {
	t.Helper()
	ops, err := dataupdater.DecodePatch([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// Full builds a full bundle.
func Full(hash string, policies map[string]string, data map[string]string) *fetcher.PolicyBundle {
	b := &fetcher.PolicyBundle{Hash: hash, Manifest: []string{}, DataModules: []fetcher.DataModule{}, PolicyModules: []fetcher.PolicyModule{}}
	for _, p := range sortedKeys(policies) {
		b.Manifest = append(b.Manifest, p)
		b.PolicyModules = append(b.PolicyModules, fetcher.PolicyModule{Path: p, Rego: policies[p]})
	}
	for _, d := range sortedKeys(data) {
		b.DataModules = append(b.DataModules, fetcher.DataModule{Path: d, Data: data[d]})
	}
	return b
}

// Delta builds a delta bundle from old to hash.
func Delta(old, hash string, policies, data map[string]string, deletedPolicies, deletedData []string) *fetcher.PolicyBundle {
	b := Full(hash, policies, data)
	b.OldHash = &old
	if len(deletedPolicies)+len(deletedData) > 0 {
		b.DeletedFiles = &fetcher.DeletedFiles{PolicyModules: deletedPolicies, DataModules: deletedData}
	}
	return b
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// OPA is a client of an OPA REST API at Base ("http://host:port").
type OPA struct {
	T    testing.TB
	Base string
}

// Do sends a request and returns status and body; it fails the test on a
// transport error. Real loopback I/O, bounded by a deadline.
func (o OPA) Do(method, path, body string) (int, string) {
	o.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, o.Base+path, strings.NewReader(body))
	if err != nil {
		o.T.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		o.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		o.T.Fatal(err)
	}
	// OPA ends its JSON with a newline; tests compare the documents.
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// Get returns the body of GET path, failing the test unless it is 200.
func (o OPA) Get(path string) string {
	o.T.Helper()
	code, body := o.Do("GET", path, "")
	if code != 200 {
		o.T.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}

// Must sends a request and fails the test unless the status is one of ok.
func (o OPA) Must(method, path, body string, ok ...int) {
	o.T.Helper()
	code, resp := o.Do(method, path, body)
	for _, c := range ok {
		if code == c {
			return
		}
	}
	o.T.Fatalf("%s %s: %d %s", method, path, code, resp)
}

// Snapshot is everything a decision can depend on: the whole data document
// (rules evaluated) and the policy list, byte for byte.
func (o OPA) Snapshot() string {
	o.T.Helper()
	var list struct {
		Result []struct {
			ID string `json:"id"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(o.Get("/v1/policies")), &list); err != nil {
		o.T.Fatal(err)
	}
	ids := make([]string, 0, len(list.Result))
	for _, p := range list.Result {
		ids = append(ids, p.ID)
	}
	sort.Strings(ids) // OPA lists policies in no fixed order
	out := o.Get("/v1/data")
	for _, id := range ids {
		out += "\n" + o.Get("/v1/policies/"+id)
	}
	return out
}
