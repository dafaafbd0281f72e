package statsauth

import (
	"encoding/base64"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"
)

// FuzzPeek: peek reads the unverified claims of any bearer token a client
// sends, before the API server is asked; its answer may refuse a token,
// never admit one.
//
//	| input                      | invariant                                            |
//	|----------------------------|------------------------------------------------------|
//	| any                        | no panic                                             |
//	| refused                    | no claims at all (zero audience and expiry): nothing |
//	|                            | of a malformed token can be mistaken for a claim     |
//	| accepted                   | three dot-separated parts, the middle base64url      |
//	|                            | without padding and decoding to a JSON value         |
//	| accepted, aud a string     | the audience is exactly that one string              |
//	| any, and it repeated to at | bytes allocated at most linear in the token's length |
//	| least 64 KiB               | (bounded work however large the token)               |
func FuzzPeek(f *testing.F) {
	enc := base64.RawURLEncoding.EncodeToString
	for _, s := range []string{
		jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour)),
		jwt("agent", []string{"other", DefaultAudience}, t0),
		enc([]byte(`{}`)) + "." + enc([]byte(`{"aud":"sockscale-controller","exp":1}`)) + ".sig",
		"a.b.c",
		"not-a-jwt",
		"a..c",
		"x." + enc([]byte(`{"aud":"sockscale-controller","exp":"soon"}`)) + ".y",
		"x." + enc([]byte(`{"aud":["a",1]}`)) + ".y",
		"x.e30=.y",
		strings.Repeat(".", 100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := peek(token)
		parts := strings.Split(token, ".")
		if err != nil {
			if c.Audience != nil || c.Expiry != 0 {
				t.Errorf("peek(%q) = %+v with error %v: claims of a token it refuses", token, c, err)
			}
		} else {
			if len(parts) != 3 {
				t.Fatalf("peek(%q) accepted %d parts", token, len(parts))
			}
			payload, derr := base64.RawURLEncoding.DecodeString(parts[1])
			if derr != nil || !json.Valid(payload) {
				t.Fatalf("peek(%q) accepted claims that are not base64url JSON (%v)", token, derr)
			}
			var raw map[string]json.RawMessage
			if json.Unmarshal(payload, &raw) == nil {
				var one string
				if a, ok := raw["aud"]; ok && json.Unmarshal(a, &one) == nil && (len(c.Audience) != 1 || c.Audience[0] != one) {
					t.Errorf("peek(%q): aud %s read as %q", token, a, []string(c.Audience))
				}
			}
		}

		big := token
		if len(big) > 0 {
			big = strings.Repeat(token, 1+(64<<10)/len(token))
		}
		for _, s := range []string{token, big} {
			if n := allocated(func() { _, _ = peek(s) }); n > 32*uint64(len(s))+64<<10 {
				t.Errorf("peek of %d bytes (%.40q...) allocated %d bytes, over 32 per byte + 64 KiB", len(s), s, n)
			}
		}
	})
}

// allocated is the bytes fn allocates (the fuzz worker runs one input at
// a time, so little else allocates meanwhile).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
