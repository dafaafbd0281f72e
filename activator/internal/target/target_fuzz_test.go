package target

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzParseKey: the Sockscale-Target header is any client's input.
//
//	| input                  | invariant                                                   |
//	|------------------------|-------------------------------------------------------------|
//	| accepted               | namespace a DNS-1123 label, name a DNS-1035 label (a        |
//	|                        | Service's), so exactly one slash and no other separator     |
//	| accepted               | String() gives the input back, and parses to the same key   |
//	| rejected               | the zero Key, and the error quotes the input                |
//	| any                    | "<ns>/<name>" of valid names is accepted (agreement with    |
//	|                        | Kubernetes' own validation, the model)                      |
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"default/hello", "hello", "/hello", "default/", "a/b/c", "Default/Hello", "ns/a b", "ns/x\x00", "team/hello-00001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		ns, name, cut := strings.Cut(s, "/")
		valid := cut && len(validation.IsDNS1123Label(ns)) == 0 && len(validation.IsDNS1035Label(name)) == 0
		if err != nil {
			if k != (Key{}) {
				t.Errorf("ParseKey(%q) = %v with error %v, want the zero Key", s, k, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
				t.Errorf("ParseKey(%q) error %q does not quote the input", s, err)
			}
			if valid {
				t.Errorf("ParseKey(%q) refused valid names: %v", s, err)
			}
			return
		}
		if !valid {
			t.Fatalf("ParseKey(%q) = %#v, but %q/%q are not a DNS-1123 label / DNS-1035 label", s, k, ns, name)
		}
		if strings.Count(s, "/") != 1 {
			t.Errorf("ParseKey(%q) accepted %d slashes", s, strings.Count(s, "/"))
		}
		if k.String() != s {
			t.Errorf("ParseKey(%q).String() = %q, want the input", s, k.String())
		}
		if again, err := ParseKey(k.String()); err != nil || again != k {
			t.Errorf("ParseKey(String()) = %v, %v; want %v", again, err, k)
		}
	})
}
