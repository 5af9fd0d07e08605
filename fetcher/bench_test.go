package fetcher

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// The Retry-After parser runs on every 503/429; it must stay cheap for any input.
func BenchmarkParseRetryAfter(b *testing.B) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, v := range []string{"30", "Fri, 02 Jan 2026 03:05:05 GMT", "garbage"} {
		b.Run(v, func(b *testing.B) {
			for b.Loop() {
				ParseRetryAfter(v, now)
			}
		})
	}
}

// Decoding a 1,000-module bundle: the fetcher's share of a full update;
// "unmarshal" is the whole-body json.Unmarshal it replaced, for scale.
func BenchmarkDecodeBundle(b *testing.B) {
	body := benchBundle(b)
	for _, c := range []struct {
		name   string
		decode func([]byte) (*PolicyBundle, error)
	}{{"stream", DecodeBundle}, {"unmarshal", refDecodeBundle}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := c.decode(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchBundle(b *testing.B) []byte {
	bu := PolicyBundle{Manifest: []string{}, Hash: "h", DataModules: []DataModule{}, PolicyModules: []PolicyModule{}}
	for i := range 1000 {
		p := fmt.Sprintf("pkg%d/policy.rego", i)
		bu.Manifest = append(bu.Manifest, p)
		bu.PolicyModules = append(bu.PolicyModules, PolicyModule{Path: p, PackageName: fmt.Sprintf("pkg%d", i),
			Rego: fmt.Sprintf("package pkg%d\n\ndefault allow := false\n\nallow if input.user == \"u%d\"\n", i, i)})
	}
	body, err := json.Marshal(bu)
	if err != nil {
		b.Fatal(err)
	}
	return body
}
