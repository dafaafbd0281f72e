package redirect

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHeaderMatchesGo keeps redirect.c's limits and Go's equal.
func TestHeaderMatchesGo(t *testing.T) {
	src, err := os.ReadFile("redirect.c")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	for _, m := range regexp.MustCompile(`(?m)^#define (\w+) (\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, err := strconv.ParseUint(m[2], 10, 64)
		if err != nil {
			t.Fatalf("parse %s: %v", m[1], err)
		}
		defines[m[1]] = v
	}
	want := map[string]uint64{"MAX_SERVICES": MaxServices, "MAX_BACKENDS": MaxBackends, "MAX_WEIGHT": MaxWeight, "MAX_HOPS": MaxHops}
	if diff := cmp.Diff(want, defines); diff != "" {
		t.Errorf("redirect.c #defines (-Go +C):\n%s", diff)
	}
	// The weight is a __u16 in the kernel and the total a __u32.
	if MaxWeight > math.MaxUint16 || MaxBackends*MaxWeight > math.MaxUint32 {
		t.Errorf("MaxWeight %d and MaxBackends %d overflow the kernel's fields", MaxWeight, MaxBackends)
	}
}

func TestCheckService(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string // the normalised address, or
		wantErr string // a part of the error
	}{
		{in: "10.96.0.10:80", want: "10.96.0.10:80"},
		{in: "[::ffff:10.96.0.10]:443", want: "10.96.0.10:443"},
		{in: "10.96.0.10:0", wantErr: "service 10.96.0.10:0: port 0, want 1..65535"},
		{in: "[fd5c:a1e:96::a]:80", want: "[fd5c:a1e:96::a]:80"},
		{in: "[fe80::1%eth0]:80", wantErr: "service [fe80::1%eth0]:80: a zoned address is not a Service address"},
		{in: "0.0.0.0:80", wantErr: "service 0.0.0.0:80: the unspecified address 0.0.0.0"},
		{in: "[::]:80", wantErr: "service [::]:80: the unspecified address ::"},
		{in: "[::ffff:0.0.0.0]:80", wantErr: "service [::ffff:0.0.0.0]:80: the unspecified address 0.0.0.0"},
	} {
		got, err := checkService(netip.MustParseAddrPort(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalid) {
				t.Errorf("checkService(%s) = %v, want an ErrInvalid containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("checkService(%s) = %v, %v, want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := checkService(netip.AddrPort{}); err == nil {
		t.Error("checkService(zero AddrPort) accepted it")
	}
}

func TestCheckBackends(t *testing.T) {
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	b := func(addr string, w uint32) Backend { return Backend{Addr: netip.MustParseAddrPort(addr), Weight: w} }
	many := func(n int) []Backend {
		out := make([]Backend, n)
		for i := range out {
			out[i] = b("10.0.0."+strconv.Itoa(i+1)+":8012", 1)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		in      []Backend
		want    []Backend
		wantErr string
	}{
		{name: "activators", in: many(3), want: many(3)},
		{name: "split", in: []Backend{b("10.96.1.1:80", 90), b("10.96.1.2:80", 10)}, want: []Backend{b("10.96.1.1:80", 90), b("10.96.1.2:80", 10)}},
		{name: "max backends", in: many(MaxBackends), want: many(MaxBackends)},
		{name: "max weight", in: []Backend{b("10.0.0.1:1", MaxWeight)}, want: []Backend{b("10.0.0.1:1", MaxWeight)}},
		{name: "mapped address", in: []Backend{b("[::ffff:10.0.0.1]:8012", 1)}, want: []Backend{b("10.0.0.1:8012", 1)}},
		{name: "none", in: nil, wantErr: "service 10.96.0.10:80: 0 backends, want 1..32"},
		{name: "too many", in: many(MaxBackends + 1), wantErr: "33 backends, want 1..32"},
		{name: "weight 0", in: []Backend{b("10.0.0.1:8012", 1), b("10.0.0.2:8012", 0)}, wantErr: "backend 1 (10.0.0.2:8012): weight 0, want 1..65535"},
		{name: "weight too big", in: []Backend{b("10.0.0.1:8012", MaxWeight+1)}, wantErr: "backend 0 (10.0.0.1:8012): weight 65536, want 1..65535"},
		{name: "port 0", in: []Backend{b("10.0.0.1:0", 1)}, wantErr: "backend 0 (10.0.0.1:0): port 0, want 1..65535"},
		{name: "IPv6 backend of an IPv4 service", in: []Backend{b("10.0.0.1:8012", 1), b("[fd00::1]:8012", 1)},
			wantErr: "service 10.96.0.10:80: backend 1 ([fd00::1]:8012) is IPv6, the service IPv4: an entry's backends must be of its family"},
		{name: "zoned", in: []Backend{b("[fe80::1%eth0]:8012", 1)}, wantErr: "backend 0 ([fe80::1%eth0]:8012): a zoned address cannot be a backend"},
		{name: "unspecified", in: []Backend{b("0.0.0.0:8012", 1)}, wantErr: "backend 0 (0.0.0.0:8012): the unspecified address"},
		{name: "twice", in: []Backend{b("10.0.0.1:8012", 1), b("[::ffff:10.0.0.1]:8012", 2)}, wantErr: "backend 10.0.0.1:8012 is listed twice (0 and 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkBackends(svc, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("checkBackends = %v, want an ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("checkBackends (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckBackendsIPv6: an IPv6 Service takes IPv6 backends only; an
// IPv4-mapped backend is IPv4.
func TestCheckBackendsIPv6(t *testing.T) {
	svc := netip.MustParseAddrPort("[fd5c:a1e:96::a]:80")
	b := func(addr string, w uint32) Backend { return Backend{Addr: netip.MustParseAddrPort(addr), Weight: w} }
	for _, tc := range []struct {
		name    string
		in      []Backend
		want    []Backend
		wantErr string
	}{
		{name: "activators", in: []Backend{b("[fd5c:a1e:0:1::5]:8012", 1), b("[fd5c:a1e:0:2::5]:8012", 1)}, want: []Backend{b("[fd5c:a1e:0:1::5]:8012", 1), b("[fd5c:a1e:0:2::5]:8012", 1)}},
		{name: "split", in: []Backend{b("[fd5c:a1e:96::b]:80", 90), b("[fd5c:a1e:96::c]:80", 10)}, want: []Backend{b("[fd5c:a1e:96::b]:80", 90), b("[fd5c:a1e:96::c]:80", 10)}},
		{name: "IPv4 backend", in: []Backend{b("[fd5c:a1e:0:1::5]:8012", 1), b("10.0.0.1:8012", 1)},
			wantErr: "service [fd5c:a1e:96::a]:80: backend 1 (10.0.0.1:8012) is IPv4, the service IPv6: an entry's backends must be of its family"},
		{name: "IPv4-mapped backend", in: []Backend{b("[::ffff:10.0.0.1]:8012", 1)},
			wantErr: "backend 0 ([::ffff:10.0.0.1]:8012) is IPv4, the service IPv6"},
		{name: "unspecified", in: []Backend{b("[::]:8012", 1)}, wantErr: "backend 0 ([::]:8012): the unspecified address :: cannot be connected to"},
		{name: "twice", in: []Backend{b("[fd5c:a1e:0:1::5]:8012", 1), b("[fd5c:a1e:0:1::5]:8012", 2)}, wantErr: "backend [fd5c:a1e:0:1::5]:8012 is listed twice (0 and 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checkBackends(svc, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("checkBackends = %v, want an ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("checkBackends (-want +got):\n%s", diff)
			}
		})
	}
}

// pickModel is redirect.c's pick in Go: r scaled to [0, total) by
// multiply-shift falls into one backend's share of the cumulative weights.
func pickModel(r uint32, weights []uint16) int {
	total := uint64(0)
	for _, w := range weights {
		total += uint64(w)
	}
	x := uint32((uint64(r) * total) >> 32)
	for i, w := range weights {
		if x < uint32(w) {
			return i
		}
		x -= uint32(w)
	}
	return -1
}

// TestPickModelShares checks the selection exactly: backend i gets the r in
// [first(C_i-1), first(C_i)), where C is the cumulative weight and first(c)
// the least r with r*total >= c*2^32, so its share of the 2^32 values of r
// is within one value of weight/total.
func TestPickModelShares(t *testing.T) {
	for _, weights := range [][]uint16{
		{1},
		{1, 1, 1},
		{90, 10},
		{1, 2, 5},
		{MaxWeight, 1, MaxWeight},
		{3, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 65535},
	} {
		total := uint64(0)
		for _, w := range weights {
			total += uint64(w)
		}
		first := func(c uint64) uint64 { return (c<<32 + total - 1) / total } // ceil(c * 2^32 / total)
		cum := uint64(0)
		for i, w := range weights {
			lo, hi := first(cum), first(cum+uint64(w))
			cum += uint64(w)
			if share, want := float64(hi-lo), float64(w)/float64(total)*(1<<32); math.Abs(share-want) >= 1 {
				t.Errorf("weights %v: backend %d gets %.0f of 2^32 values of r, want %.2f", weights, i, share, want)
			}
			// The model agrees at both ends of the range and inside it.
			for _, r := range []uint64{lo, (lo + hi) / 2, hi - 1} {
				if got := pickModel(uint32(r), weights); got != i {
					t.Errorf("weights %v: r=%d picks %d, want %d", weights, r, got, i)
				}
			}
			if lo > 0 {
				if got := pickModel(uint32(lo-1), weights); got != i-1 {
					t.Errorf("weights %v: r=%d (just below backend %d's range) picks %d, want %d", weights, lo-1, i, got, i-1)
				}
			}
		}
		if hi := first(total); hi != 1<<32 {
			t.Errorf("weights %v: the ranges end at %d, want 2^32", weights, hi)
		}
	}
}

// TestPickModelRandom: random weights, random r, never off the end.
func TestPickModelRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		weights := make([]uint16, 1+rng.IntN(MaxBackends))
		for i := range weights {
			weights[i] = uint16(1 + rng.IntN(MaxWeight))
		}
		for _, r := range []uint32{0, math.MaxUint32, rng.Uint32()} {
			if got := pickModel(r, weights); got < 0 || got >= len(weights) {
				t.Fatalf("weights %v: r=%d picks %d", weights, r, got)
			}
		}
	}
}
