package embedded

import (
	"context"
	"testing"

	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// numberCases are bundle data numbers that float64 would change: each must
// read back from the store with every digit (issue: numbers stay exact).
var numberCases = []struct {
	name, data, path, want string
}{
	// 2^53 + 1: float64 rounds it to 9007199254740992.
	{"bundle_int_above_2pow53_exact", `{"n": 9007199254740993}`, "/v1/data/nums/n", `{"result":9007199254740993}`},
	{"bundle_root_int_above_2pow53_exact", `{"big": {"n": 18446744073709551617}}`, "/v1/data/big/n", `{"result":18446744073709551617}`},
	{"bundle_decimal_digits_exact", `{"d": 0.10000000000000000555}`, "/v1/data/nums/d", `{"result":0.10000000000000000555}`},
}

// Bundle data is decoded with UseNumber, as OPA decodes it. Mutation caught:
// drop dec.UseNumber() in store.DecodeData.
func TestBundleDataNumbersExact(t *testing.T) {
	for _, tc := range numberCases {
		t.Run(tc.name, func(t *testing.T) {
			s, o := newStore(t)
			dir := "nums"
			if tc.path == "/v1/data/big/n" {
				dir = "."
			}
			if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"p.rego": "package p\n\nx := 1\n"},
				map[string]string{dir: tc.data})); err != nil {
				t.Fatal(err)
			}
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("GET %s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
}
