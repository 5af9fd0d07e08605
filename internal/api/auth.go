package api

// JWT authentication of the routes that change the agent's behaviour, as
// the Python client verifies them (opal_common.authentication: JWTVerifier,
// verify_logged_in, require_peer_type): a bearer token signed with the key
// of OPAL_AUTH_PUBLIC_KEY by OPAL_AUTH_JWT_ALGORITHM, whose aud contains
// OPAL_AUTH_JWT_AUDIENCE and whose iss is OPAL_AUTH_JWT_ISSUER, not expired
// and not used before its nbf/iat (PyJWT's checks, no leeway), with a UUID
// sub and, for the connectivity routes, peer_type "listener".
//
// Built on the standard library rather than lestrrat-go/jwx (already an
// indirect dependency through OPA): the checks must be PyJWT's exactly
// (which claims are required, exp <= now is expired, the error texts), and
// the signature schemes are a few lines each over crypto/rsa, crypto/ecdsa
// and crypto/ed25519; jwx's validation defaults differ and would have to be
// overridden one by one.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/benbjohnson/clock"
)

// VerifierOptions are the OPAL_AUTH_* settings.
type VerifierOptions struct {
	// PublicKey is OPAL_AUTH_PUBLIC_KEY: the key, or a path to a file holding
	// it; "" disables authentication.
	PublicKey string
	// Format is OPAL_AUTH_PUBLIC_KEY_FORMAT: "ssh" (default), "pem" or "der".
	Format string
	// Algorithm is OPAL_AUTH_JWT_ALGORITHM: RS256 (default), RS384, RS512,
	// PS256, PS384, PS512, ES256, ES384, ES512 or EdDSA.
	Algorithm string
	// Audience and Issuer are OPAL_AUTH_JWT_AUDIENCE and _ISSUER.
	Audience, Issuer string
	// Clock tells expiry; nil = real.
	Clock clock.Clock
}

// Verifier checks bearer tokens. A nil *Verifier accepts every request
// (authentication off, as without a public key in the Python client).
type Verifier struct {
	alg      string
	key      crypto.PublicKey
	audience string
	issuer   string
	clk      clock.Clock
}

// ErrKey is wrapped by NewVerifier's errors: the key or the algorithm
// cannot be used. The Python client logs such a key and runs without
// authentication; we refuse to start instead.
var ErrKey = errors.New("OPAL_AUTH_PUBLIC_KEY unusable")

// AuthError is a refused request; Reason is the Python client's text.
type AuthError struct{ Reason string }

func (e *AuthError) Error() string { return "unauthorized: " + e.Reason }

// The Python client's descriptions of a refused token.
const (
	reasonMissing  = "access token was not provided"
	reasonExpired  = "Access token is expired"
	reasonAudience = "Invalid access token: invalid audience claim"
	reasonIssuer   = "Invalid access token: invalid issuer claim"
	reasonDecode   = "Could not decode access token"
	reasonUnknown  = "Unknown JWT error"
	reasonSub      = "invalid sub claim"
)

// NewVerifier builds the verifier; nil, nil when no public key is set.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	if strings.TrimSpace(o.PublicKey) == "" {
		return nil, nil
	}
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	if o.Algorithm == "" {
		o.Algorithm = "RS256"
	}
	if o.Format == "" {
		o.Format = "ssh"
	}
	key, err := loadPublicKey(o.PublicKey, o.Format)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	if err := keyFits(o.Algorithm, key); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	return &Verifier{alg: o.Algorithm, key: key, audience: o.Audience, issuer: o.Issuer, clk: o.Clock}, nil
}

// loadPublicKey reads the key as cast_public_key does: a path to a file
// (~ expanded) or the key itself; a PEM or DER key given inline may have
// its newlines replaced by '_'.
func loadPublicKey(value, format string) (crypto.PublicKey, error) {
	var raw []byte
	p := value
	if strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			p = filepath.Join(home, p[2:])
		}
	}
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		if raw, err = os.ReadFile(p); err != nil {
			return nil, err
		}
	} else if format == "ssh" {
		raw = []byte(value)
	} else {
		raw = []byte(value)
		if !strings.Contains(value, "\n") {
			raw = []byte(strings.ReplaceAll(value, "_", "\n"))
			if !strings.HasSuffix(string(raw), "\n") {
				raw = append(raw, '\n')
			}
		}
	}
	switch format {
	case "ssh":
		return parseSSHPublicKey(raw)
	case "pem":
		b, _ := pem.Decode(raw)
		if b == nil {
			return nil, errors.New("no PEM block")
		}
		return parseDER(b.Bytes)
	case "der":
		return parseDER(raw)
	}
	return nil, fmt.Errorf("key format %q: want ssh, pem or der", format)
}

func parseDER(der []byte) (crypto.PublicKey, error) {
	if k, err := x509.ParsePKIXPublicKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PublicKey(der); err == nil {
		return k, nil
	}
	return nil, errors.New("not a DER public key (SubjectPublicKeyInfo or PKCS#1)")
}

// parseSSHPublicKey reads one "type base64 [comment]" line (RFC 4253 §6.6,
// RFC 5656, RFC 8709): ssh-rsa, ecdsa-sha2-nistp256/384/521, ssh-ed25519.
func parseSSHPublicKey(raw []byte) (crypto.PublicKey, error) {
	fields := strings.Fields(string(raw))
	if len(fields) < 2 {
		return nil, errors.New("not an OpenSSH public key line")
	}
	blob, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil {
		return nil, fmt.Errorf("OpenSSH public key: %v", err)
	}
	r := sshReader{b: blob}
	typ := string(r.next())
	if typ != fields[0] {
		return nil, fmt.Errorf("OpenSSH public key: type %q does not match its blob %q", fields[0], typ)
	}
	var key crypto.PublicKey
	switch typ {
	case "ssh-rsa":
		e, n := r.next(), r.next()
		if r.err == nil && len(e) <= 4 {
			key = &rsa.PublicKey{E: int(new(big.Int).SetBytes(e).Int64()), N: new(big.Int).SetBytes(n)}
		}
	case "ssh-ed25519":
		k := r.next()
		if r.err == nil && len(k) == ed25519.PublicKeySize {
			key = ed25519.PublicKey(k)
		}
	case "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521":
		curves := map[string]elliptic.Curve{"nistp256": elliptic.P256(), "nistp384": elliptic.P384(), "nistp521": elliptic.P521()}
		name, point := string(r.next()), r.next()
		if c, ok := curves[name]; ok && r.err == nil && "ecdsa-sha2-"+name == typ {
			if k, err := ecdsa.ParseUncompressedPublicKey(c, point); err == nil {
				key = k
			}
		}
	default:
		return nil, fmt.Errorf("OpenSSH key type %q not supported", typ)
	}
	if key == nil || r.err != nil || len(r.b) != 0 {
		return nil, fmt.Errorf("OpenSSH public key of type %s is malformed", typ)
	}
	return key, nil
}

type sshReader struct {
	b   []byte
	err error
}

func (r *sshReader) next() []byte {
	if r.err != nil || len(r.b) < 4 {
		r.err = errors.New("short")
		return nil
	}
	n := binary.BigEndian.Uint32(r.b)
	if uint64(len(r.b)-4) < uint64(n) {
		r.err = errors.New("short")
		return nil
	}
	v := r.b[4 : 4+n]
	r.b = r.b[4+n:]
	return v
}

// algHash is the digest of a JWS algorithm ("" for EdDSA).
func algHash(alg string) (crypto.Hash, bool) {
	switch alg {
	case "RS256", "PS256", "ES256":
		return crypto.SHA256, true
	case "RS384", "PS384", "ES384":
		return crypto.SHA384, true
	case "RS512", "PS512", "ES512":
		return crypto.SHA512, true
	case "EdDSA":
		return 0, true
	}
	return 0, false
}

// keyFits refuses an algorithm this verifier cannot run with the key (the
// Python client's PyJWK check): HMAC needs a shared secret, not a public key.
func keyFits(alg string, key crypto.PublicKey) error {
	if _, ok := algHash(alg); !ok {
		return fmt.Errorf("OPAL_AUTH_JWT_ALGORITHM %q: want RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512 or EdDSA", alg)
	}
	ok := false
	switch k := key.(type) {
	case *rsa.PublicKey:
		ok = alg[0] == 'R' || alg[0] == 'P'
	case *ecdsa.PublicKey:
		want := map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}[alg]
		ok = want != nil && k.Curve == want
	case ed25519.PublicKey:
		ok = alg == "EdDSA"
	}
	if !ok {
		return fmt.Errorf("a %T key cannot verify %s", key, alg)
	}
	return nil
}

func newHash(h crypto.Hash) hash.Hash {
	switch h {
	case crypto.SHA384:
		return sha512.New384()
	case crypto.SHA512:
		return sha512.New()
	}
	return sha256.New()
}

// b64 decodes base64url with or without padding, as PyJWT does.
func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// Verify checks a token and returns its claims, or an *AuthError.
func (v *Verifier) Verify(token string) (map[string]any, error) {
	fail := func(reason string) (map[string]any, error) { return nil, &AuthError{Reason: reason} }
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return fail(reasonDecode)
	}
	hb, err1 := b64(parts[0])
	pb, err2 := b64(parts[1])
	sig, err3 := b64(parts[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return fail(reasonDecode)
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(hb, &header) != nil {
		return fail(reasonDecode)
	}
	if header.Alg != v.alg { // guard: mutation "header.Alg == \"none\"" accepts a token of another algorithm
		return fail(reasonUnknown) // PyJWT's InvalidAlgorithmError
	}
	if !v.verifySignature([]byte(parts[0]+"."+parts[1]), sig) { // guard: mutation "&& false" accepts a forged signature
		return fail(reasonDecode) // InvalidSignatureError is a DecodeError
	}
	var claims map[string]any
	dec := json.NewDecoder(strings.NewReader(string(pb)))
	dec.UseNumber()
	if dec.Decode(&claims) != nil || claims == nil {
		return fail(reasonDecode)
	}
	if reason := v.checkClaims(claims); reason != "" {
		return fail(reason)
	}
	return claims, nil
}

func (v *Verifier) verifySignature(signed, sig []byte) bool {
	h, _ := algHash(v.alg)
	var digest []byte
	if h != 0 {
		w := newHash(h)
		w.Write(signed)
		digest = w.Sum(nil)
	}
	switch k := v.key.(type) {
	case *rsa.PublicKey:
		if v.alg[0] == 'P' {
			return rsa.VerifyPSS(k, h, digest, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}) == nil
		}
		return rsa.VerifyPKCS1v15(k, h, digest, sig) == nil
	case *ecdsa.PublicKey:
		size := (k.Curve.Params().BitSize + 7) / 8
		if len(sig) != 2*size {
			return false
		}
		r, s := new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:])
		return ecdsa.Verify(k, digest, r, s)
	case ed25519.PublicKey:
		return ed25519.Verify(k, signed, sig)
	}
	return false
}

// numericDate is PyJWT's int(claim): a JSON number (truncated) or a string
// of decimal digits.
func numericDate(v any) (int64, bool) {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, true
		}
		if f, err := x.Float64(); err == nil {
			return int64(f), true
		}
	case string:
		if i, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
			return i, true
		}
	}
	return 0, false
}

// checkClaims runs PyJWT's claim checks in its order (iat, nbf, exp, iss,
// aud), then the Python client's sub check; "" when all pass.
func (v *Verifier) checkClaims(c map[string]any) string {
	now := v.clk.Now().Unix()
	if raw, ok := c["iat"]; ok {
		iat, ok := numericDate(raw)
		if !ok || iat > now {
			return reasonUnknown // InvalidIssuedAtError / ImmatureSignatureError
		}
	}
	if raw, ok := c["nbf"]; ok {
		nbf, ok := numericDate(raw)
		if !ok {
			return reasonDecode
		}
		if nbf > now {
			return reasonUnknown // ImmatureSignatureError
		}
	}
	if raw, ok := c["exp"]; ok {
		exp, ok := numericDate(raw)
		if !ok {
			return reasonDecode
		}
		if exp <= now { // guard: mutation "exp <= now-3600" accepts an expired token
			return reasonExpired
		}
	}
	iss, ok := c["iss"]
	if !ok {
		return reasonUnknown // MissingRequiredClaimError
	}
	if iss != v.issuer { // guard: mutation "iss == nil" accepts another issuer
		return reasonIssuer
	}
	aud, ok := c["aud"]
	if !ok {
		return reasonUnknown // MissingRequiredClaimError
	}
	var auds []any
	switch a := aud.(type) {
	case string:
		auds = []any{a}
	case []any:
		auds = a
	default:
		return reasonAudience
	}
	found := false
	for _, a := range auds {
		s, ok := a.(string)
		if !ok {
			return reasonAudience
		}
		if s == v.audience {
			found = true
		}
	}
	if !found { // guard: mutation "!found && false" accepts another audience
		return reasonAudience
	}
	if sub, _ := c["sub"].(string); !isUUID(sub) {
		return reasonSub
	}
	return ""
}

// isUUID accepts what Python's uuid.UUID(str) accepts: 32 hex digits, with
// any hyphens, optionally in braces and after "urn:uuid:".
func isUUID(s string) bool {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "urn:"), "uuid:")
	s = strings.Trim(s, "{}")
	s = strings.ReplaceAll(s, "-", "")
	if len(s) != 32 {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

// bearer extracts the token of an "Authorization: Bearer <token>" header
// (get_token_from_header: the scheme case-insensitive).
func bearer(h string) string {
	scheme, token, _ := strings.Cut(h, " ")
	if token == "" || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return token
}

// requirePeer wraps a handler: without a verifier it runs as is; with one,
// a request without a valid token of the peer type answers 401
// {"detail":{"error":...}} with WWW-Authenticate: Bearer, as the Python
// client's Unauthorized (which also echoes the token; we do not).
func (v *Verifier) requirePeer(peerType string, log *slog.Logger, next http.HandlerFunc) http.HandlerFunc {
	if v == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		reason := ""
		token := bearer(r.Header.Get("Authorization"))
		if token == "" { // guard: mutation "token == \"-\"" lets a request without a token through
			reason = reasonMissing
		} else if claims, err := v.Verify(token); err != nil {
			reason = err.(*AuthError).Reason
		} else {
			reason = peerTypeReason(claims, peerType)
		}
		if reason != "" {
			log.Warn("client API request refused", "path", r.URL.Path, "reason", reason)
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeJSON(w, http.StatusUnauthorized, map[string]any{"detail": map[string]any{"error": reason}})
			return
		}
		next(w, r)
	}
}

// peerTypeReason is require_peer_type.
func peerTypeReason(claims map[string]any, want string) string {
	pt, ok := claims["peer_type"]
	if !ok {
		return "Missing 'peer_type' claim for OPAL jwt token"
	}
	s, _ := pt.(string)
	switch s {
	case "client", "datasource", "listener":
	default:
		return fmt.Sprintf("Invalid 'peer_type' claim for OPAL jwt token: %v", pt)
	}
	if s != want { // guard: mutation "s == \"\"" accepts a token of another peer type
		return fmt.Sprintf("Incorrect 'peer_type' claim for OPAL jwt token: PeerType.%s, expected: PeerType.%s", s, want)
	}
	return ""
}
