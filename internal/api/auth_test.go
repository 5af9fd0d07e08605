package api

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

const (
	testAud = "https://api.opal.ac/v1/"
	testIss = "https://opal.ac/"
	testSub = "4b6a1f7e-2d3c-4e5f-8a9b-0c1d2e3f4a5b"
)

// sign builds a JWS compact token over claims with header alg.
func sign(t *testing.T, alg string, key crypto.Signer, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]any{"alg": alg, "typ": "JWT"})
	p, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding.EncodeToString
	signed := enc(h) + "." + enc(p)
	var sig []byte
	var err error
	switch k := key.(type) {
	case *rsa.PrivateKey:
		d := sha256.Sum256([]byte(signed))
		if strings.HasPrefix(alg, "PS") {
			sig, err = rsa.SignPSS(rand.Reader, k, crypto.SHA256, d[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		} else {
			sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, d[:])
		}
	case *ecdsa.PrivateKey:
		d := sha256.Sum256([]byte(signed))
		var r, s *big.Int
		r, s, err = ecdsa.Sign(rand.Reader, k, d[:])
		if err == nil {
			sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
		}
	case ed25519.PrivateKey:
		sig = ed25519.Sign(k, []byte(signed))
	}
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + enc(sig)
}

// sshLine is the OpenSSH authorized_keys form of a public key.
func sshLine(t *testing.T, pub crypto.PublicKey) string {
	t.Helper()
	str := func(b []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...) }
	mpint := func(i *big.Int) []byte {
		b := i.Bytes()
		if len(b) > 0 && b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return str(b)
	}
	var typ string
	var blob []byte
	switch k := pub.(type) {
	case *rsa.PublicKey:
		typ = "ssh-rsa"
		blob = append(append(str([]byte(typ)), mpint(big.NewInt(int64(k.E)))...), mpint(k.N)...)
	case ed25519.PublicKey:
		typ = "ssh-ed25519"
		blob = append(str([]byte(typ)), str(k)...)
	case *ecdsa.PublicKey:
		typ = "ecdsa-sha2-nistp256"
		pt, err := k.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		blob = append(append(str([]byte(typ)), str([]byte("nistp256"))...), str(pt)...)
	}
	return typ + " " + base64.StdEncoding.EncodeToString(blob) + " test@host"
}

type keys struct {
	rsa, other *rsa.PrivateKey
	ec         *ecdsa.PrivateKey
	ed         ed25519.PrivateKey
}

func genKeys(t *testing.T) keys {
	t.Helper()
	var k keys
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.other, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	return k
}

func claims(clk clock.Clock, change func(map[string]any)) map[string]any {
	c := map[string]any{
		"aud": testAud, "iss": testIss, "sub": testSub, "peer_type": "listener",
		"iat": clk.Now().Unix(), "exp": clk.Now().Add(time.Hour).Unix(),
	}
	if change != nil {
		change(c)
	}
	return c
}

type okConnectivity struct{}

func (okConnectivity) ServerConnectivityDisabled() bool     { return false }
func (okConnectivity) SetServerConnectivity(bool) (ok bool) { return true }

// TestAuth_ConnectivityNeedsAListenerJWT pins the connectivity routes'
// authentication with OPAL_AUTH_PUBLIC_KEY set, as the Python client's
// JWTVerifier and require_peer_type decide: each case is one rule.
func TestAuth_ConnectivityNeedsAListenerJWT(t *testing.T) {
	k := genKeys(t)
	clk := clock.NewMock()
	clk.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	v, err := NewVerifier(VerifierOptions{PublicKey: sshLine(t, &k.rsa.PublicKey), Audience: testAud, Issuer: testIss, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(Options{Auth: v, OfflineMode: true, Connectivity: okConnectivity{}, Healthy: func(context.Context) error { return nil }})
	good := func(change func(map[string]any)) string {
		return "Bearer " + sign(t, "RS256", k.rsa, claims(clk, change))
	}
	for _, c := range []struct {
		name, method, path, auth string
		code                     int
		reason                   string
	}{
		// guards mutation `token == "-"` in requirePeer
		{"missing_token_is_401", "POST", "/opal-server/connectivity/disable", "", 401, reasonMissing},
		{"not_a_bearer_token_is_401", "POST", "/opal-server/connectivity/disable", "Basic dXNlcjpwYXNz", 401, reasonMissing},
		{"good_token_is_200", "POST", "/opal-server/connectivity/disable", good(nil), 200, ""},
		{"good_token_enable_is_200", "POST", "/opal-server/connectivity/enable", good(nil), 200, ""},
		{"status_route_needs_a_token", "GET", "/opal-server/connectivity", "", 401, reasonMissing},
		{"status_route_with_token_is_200", "GET", "/opal-server/connectivity", good(nil), 200, ""},
		{"lower_case_scheme_is_accepted", "POST", "/opal-server/connectivity/disable", "bearer " + sign(t, "RS256", k.rsa, claims(clk, nil)), 200, ""},
		// guards mutation "!found && false" in checkClaims (audience)
		{"wrong_audience_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["aud"] = "https://other/" }), 401, reasonAudience},
		{"audience_in_a_list_is_200", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["aud"] = []string{"x", testAud} }), 200, ""},
		{"missing_audience_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { delete(c, "aud") }), 401, reasonUnknown},
		// guards mutation "iss == nil" in checkClaims
		{"wrong_issuer_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["iss"] = "https://evil/" }), 401, reasonIssuer},
		{"missing_issuer_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { delete(c, "iss") }), 401, reasonUnknown},
		// guards mutation "exp <= now-3600" in checkClaims; PyJWT: exp <= now is expired
		{"expired_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["exp"] = clk.Now().Add(-time.Minute).Unix() }), 401, reasonExpired},
		{"expiring_this_second_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["exp"] = clk.Now().Unix() }), 401, reasonExpired},
		{"not_yet_valid_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["nbf"] = clk.Now().Add(time.Minute).Unix() }), 401, reasonUnknown},
		// guards mutation "&& false" in Verify (signature)
		{"bad_signature_is_401", "POST", "/opal-server/connectivity/disable", "Bearer " + sign(t, "RS256", k.other, claims(clk, nil)), 401, reasonDecode},
		{"garbage_is_401", "POST", "/opal-server/connectivity/disable", "Bearer not.a.jwt", 401, reasonDecode},
		// guards mutation `header.Alg == "none"` in Verify
		{"other_algorithm_is_401", "POST", "/opal-server/connectivity/disable", "Bearer " + sign(t, "PS256", k.rsa, claims(clk, nil)), 401, reasonUnknown},
		{"sub_not_a_uuid_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["sub"] = "admin" }), 401, reasonSub},
		{"sub_missing_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { delete(c, "sub") }), 401, reasonSub},
		// guards mutation `s == ""` in peerTypeReason
		{"other_peer_type_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { c["peer_type"] = "datasource" }), 401, "Incorrect 'peer_type' claim for OPAL jwt token: PeerType.datasource, expected: PeerType.listener"},
		{"missing_peer_type_is_401", "POST", "/opal-server/connectivity/disable", good(func(c map[string]any) { delete(c, "peer_type") }), 401, "Missing 'peer_type' claim for OPAL jwt token"},
		// Open with a key set: probes and scrapers carry no token; the
		// triggers are open in the Python client too.
		{"healthcheck_stays_open", "GET", "/healthcheck", "", 200, ""},
		{"ready_stays_open", "GET", "/ready", "", 503, ""},
		{"policy_trigger_stays_open", "POST", "/policy-updater/trigger", "", 503, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, nil)
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.code {
				t.Fatalf("%s %s = %d %s, want %d", c.method, c.path, rec.Code, rec.Body, c.code)
			}
			if c.code == 401 {
				var body struct {
					Detail struct {
						Error string `json:"error"`
					} `json:"detail"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Detail.Error != c.reason {
					t.Fatalf("body %s, want the reason %q", rec.Body, c.reason)
				}
				if rec.Header().Get("WWW-Authenticate") != "Bearer" {
					t.Fatal("a 401 must carry WWW-Authenticate: Bearer")
				}
				if c.auth != "" && strings.Contains(rec.Body.String(), strings.TrimPrefix(c.auth, "Bearer ")) {
					t.Fatal("the refusal echoes the token")
				}
			}
		})
	}
	t.Run("without_a_key_the_routes_are_open", func(t *testing.T) {
		v, err := NewVerifier(VerifierOptions{})
		if v != nil || err != nil {
			t.Fatalf("NewVerifier without a key = %v, %v; want nil, nil", v, err)
		}
		open := Handler(Options{Auth: v, OfflineMode: true, Connectivity: okConnectivity{}})
		if code, body := do(open, "POST", "/opal-server/connectivity/disable"); code != 200 {
			t.Fatalf("open route = %d %s", code, body)
		}
	})
}

// TestAuth_KeyFormatsAndAlgorithms pins how OPAL_AUTH_PUBLIC_KEY is read
// (cast_public_key: a file or the key; ssh by default, pem with '_' for
// newlines, der) and that a key or algorithm we cannot use stops the start.
func TestAuth_KeyFormatsAndAlgorithms(t *testing.T) {
	k := genKeys(t)
	clk := clock.NewMock()
	dir := t.TempDir()
	pkix := func(pub crypto.PublicKey) []byte {
		b, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pemOf := func(pub crypto.PublicKey) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix(pub)}))
	}
	derFile := filepath.Join(dir, "key.der")
	if err := os.WriteFile(derFile, pkix(&k.rsa.PublicKey), 0o600); err != nil {
		t.Fatal(err)
	}
	pemFile := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(pemFile, []byte(pemOf(k.ec.Public())), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, key, format, alg string
		signer                 crypto.Signer
	}{
		{"ssh_rsa_rs256", sshLine(t, &k.rsa.PublicKey), "", "", k.rsa},
		{"ssh_ed25519_eddsa", sshLine(t, k.ed.Public()), "ssh", "EdDSA", k.ed},
		{"ssh_ecdsa_es256", sshLine(t, k.ec.Public()), "ssh", "ES256", k.ec},
		{"pem_inline_with_underscores", strings.ReplaceAll(strings.TrimSpace(pemOf(&k.rsa.PublicKey)), "\n", "_"), "pem", "RS256", k.rsa},
		{"pem_file_es256", pemFile, "pem", "ES256", k.ec},
		{"der_file_ps256", derFile, "der", "PS256", k.rsa},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := NewVerifier(VerifierOptions{PublicKey: c.key, Format: c.format, Algorithm: c.alg, Audience: testAud, Issuer: testIss, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			alg := c.alg
			if alg == "" {
				alg = "RS256"
			}
			if _, err := v.Verify(sign(t, alg, c.signer, claims(clk, nil))); err != nil {
				t.Fatalf("a token signed with the key is refused: %v", err)
			}
		})
	}
	for _, c := range []struct{ name, key, format, alg string }{
		{"garbage_key_refused", "not a key", "ssh", "RS256"},
		{"hmac_needs_a_secret_refused", sshLine(t, &k.rsa.PublicKey), "ssh", "HS256"},
		{"unknown_algorithm_refused", sshLine(t, &k.rsa.PublicKey), "ssh", "XX1"},
		{"key_of_another_family_refused", sshLine(t, k.ed.Public()), "ssh", "RS256"},
		{"ecdsa_curve_must_fit_refused", sshLine(t, k.ec.Public()), "ssh", "ES384"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := NewVerifier(VerifierOptions{PublicKey: c.key, Format: c.format, Algorithm: c.alg}); !errors.Is(err, ErrKey) {
				t.Fatalf("err %v, want ErrKey", err)
			}
		})
	}
}
