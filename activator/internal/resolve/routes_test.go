package resolve

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// seeded is a fixed-seed draw for the weighted choice: the same numbers
// on every run.
func seeded() func(int64) int64 { return rand.New(rand.NewPCG(1, 2)).Int64N }

// shares draws n times and returns each revision's count.
func shares(n int, draw func() (string, bool)) map[string]int {
	got := map[string]int{}
	for range n {
		rev, ok := draw()
		if !ok {
			got["<none>"]++
			continue
		}
		got[rev]++
	}
	return got
}

// checkShares fails unless each revision's count is within 5 standard
// deviations of n*p: a count is binomial(n, p), sd = sqrt(n p (1-p)), so
// a correct choice lands outside with probability under 1e-6 (and the
// seed is fixed, so a pass is a pass every time); a choice off by one
// percentage point at n = 100,000 is 1,000 draws off, over 6 sd for
// p = 0.5 (sd 158) and over 7 sd for p = 0.2 (sd 126).
func checkShares(t *testing.T, n int, want map[string]float64, got map[string]int) {
	t.Helper()
	for rev, c := range got {
		if _, ok := want[rev]; !ok {
			t.Errorf("%s drawn %d times, want never", rev, c)
		}
	}
	for rev, p := range want {
		mean := float64(n) * p
		sd := math.Sqrt(float64(n) * p * (1 - p))
		if d := math.Abs(float64(got[rev]) - mean); d > 5*sd {
			t.Errorf("%s drawn %d times of %d, want %.0f ± %.0f (5 sd)", rev, got[rev], n, mean, 5*sd)
		}
	}
}

func TestChooseByPercent(t *testing.T) {
	const n = 100_000
	// hello-00001 is named twice (10 + 40): its shares add up. The tag at
	// 0 % and an entry without a revision never win.
	traffic := []Traffic{
		{Revision: "hello-00001", Percent: 10},
		{Revision: "hello-00002", Percent: 30},
		{Revision: "hello-00001", Percent: 40, Tag: "current"},
		{Revision: "hello-00003", Percent: 20},
		{Revision: "hello-00004", Tag: "next"},
		{Revision: "", Percent: 0},
	}
	draw := seeded()
	got := shares(n, func() (string, bool) { return Choose(traffic, nil, draw) })
	checkShares(t, n, map[string]float64{"hello-00001": 0.5, "hello-00002": 0.3, "hello-00003": 0.2}, got)

	// Only the eligible: 30 and 20 become 60 % and 40 %.
	notFirst := func(tr Traffic) bool { return tr.Revision != "hello-00001" }
	got = shares(n, func() (string, bool) { return Choose(traffic, notFirst, draw) })
	checkShares(t, n, map[string]float64{"hello-00002": 0.6, "hello-00003": 0.4}, got)
}

func TestChooseNothing(t *testing.T) {
	for name, traffic := range map[string][]Traffic{
		"empty":         nil,
		"only 0 %":      {{Revision: "a", Tag: "x"}},
		"no revision":   {{Percent: 100}},
		"none eligible": {{Revision: "a", Percent: 100}},
	} {
		if rev, ok := Choose(traffic, func(tr Traffic) bool { return name != "none eligible" }, seeded()); ok {
			t.Errorf("%s: chose %q, want nothing", name, rev)
		}
	}
}

// routeFixture: Route default/hello at 70/30 over hello-00001 and -00002,
// tag "latest" on -00002 and tag "old" on -00003 at 0 %; its Services
// hello, latest-hello, old-hello; and the revisions' targets.
func routeFixture(t testing.TB) *Table {
	t.Helper()
	tb := NewTable("")
	tb.intN = seeded()
	for i, rev := range []string{"hello-00001", "hello-00002", "hello-00003"} {
		mustUpsert(t, tb, tgt("default", rev).IP("10.96.0."+string(rune('1'+i))).Ports(80).Obj())
	}
	tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{
		{Revision: "hello-00001", Percent: 70},
		{Revision: "hello-00002", Percent: 30, Tag: "latest"},
		{Revision: "hello-00003", Tag: "old"},
	}})
	for _, s := range []RouteService{
		{Key: key("default", "hello"), Route: "hello", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.1.1")}, Ports: []uint16{80}, Hosts: []string{"Hello.Example.com."}},
		{Key: key("default", "latest-hello"), Route: "hello", Tag: "latest", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.1.2")}, Ports: []uint16{80}},
		{Key: key("default", "old-hello"), Route: "hello", Tag: "old", ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00::12")}, Ports: []uint16{80}},
	} {
		if err := tb.UpsertRouteService(s); err != nil {
			t.Fatal(err)
		}
	}
	return tb
}

// TestResolveRouteHosts: every host form of a Route's Service resolves to
// one of its revisions; a tag's to the tag's revision whatever its
// percent.
func TestResolveRouteHosts(t *testing.T) {
	tb := routeFixture(t)
	split := []target.Key{key("default", "hello-00001"), key("default", "hello-00002")}
	latest := []target.Key{key("default", "hello-00002")}
	old := []target.Key{key("default", "hello-00003")}
	tests := []struct {
		header, host string
		want         []target.Key // the possible results
	}{
		{host: "hello.default", want: split},
		{host: "hello.default.svc", want: split},
		{host: "hello.default.svc.cluster.local", want: split},
		{host: "HELLO.default.svc.cluster.local.:80", want: split},
		{host: "10.96.1.1", want: split},
		{host: "10.96.1.1:80", want: split},
		{host: "hello.example.com:443", want: split}, // an Ingress's host: port not checked
		{header: "default/hello", host: "whatever", want: split},
		{host: "latest-hello.default:80", want: latest},
		{host: "latest-hello.default.svc", want: latest},
		{host: "latest-hello.default.svc.cluster.local", want: latest},
		{host: "10.96.1.2:80", want: latest},
		{host: "old-hello.default.svc.cluster.local:80", want: old},
		{host: "[fd00::12]:80", want: old},
		{header: "default/old-hello", want: old},
		// The revisions' own public Services are still themselves.
		{host: "hello-00003.default", want: old},
	}
	for _, tt := range tests {
		for _, pick := range []Pick{AllRevisions, ProxiedFirst} {
			seen := map[target.Key]bool{}
			for range 200 {
				got, err := tb.resolve(tt.header, tt.host, pick)
				if err != nil {
					t.Fatalf("%s: resolve(%q, %q): %v", pick, tt.header, tt.host, err)
				}
				seen[got.Key] = true
			}
			var keys []target.Key
			for _, k := range tt.want {
				if seen[k] {
					keys = append(keys, k)
				}
				delete(seen, k)
			}
			if diff := cmp.Diff(tt.want, keys); diff != "" || len(seen) > 0 {
				t.Errorf("%s: resolve(%q, %q): missing (-want +got):\n%s; unexpected %v", pick, tt.header, tt.host, diff, seen)
			}
		}
	}
}

// TestRouteSplitByPort: the route port (AllRevisions) splits 70/30; the
// proxy port (ProxiedFirst) only among the revisions whose activator is
// in the path (Proxy mode, or no ready pod here), by their percents, and
// among all when none is.
func TestRouteSplitByPort(t *testing.T) {
	const n = 50_000
	tb := routeFixture(t)
	ready := map[target.Key]int{key("default", "hello-00001"): 2, key("default", "hello-00002"): 1, key("default", "hello-00003"): 0}
	tb.SetReadyPods(func(k target.Key) int { return ready[k] })
	draw := func(pick Pick) func() (string, bool) {
		return func() (string, bool) {
			got, err := tb.resolve("", "hello.default", pick)
			if err != nil {
				t.Fatal(err)
			}
			return got.Key.Name, true
		}
	}
	both := map[string]float64{"hello-00001": 0.7, "hello-00002": 0.3}
	checkShares(t, n, both, shares(n, draw(AllRevisions)))
	// Nothing proxied: all, by percent.
	checkShares(t, n, both, shares(n, draw(ProxiedFirst)))

	// hello-00002 in Proxy mode (its ServerlessService's status).
	proxied := tgt("default", "hello-00002").IP("10.96.0.2").Ports(80).Obj()
	proxied.Proxy = true
	mustUpsert(t, tb, proxied)
	checkShares(t, n, map[string]float64{"hello-00002": 1}, shares(n, draw(ProxiedFirst)))
	checkShares(t, n, both, shares(n, draw(AllRevisions)))

	// hello-00001 loses its last ready pod, as the throttle knows: both
	// have the activator in the path again.
	ready[key("default", "hello-00001")] = 0
	checkShares(t, n, both, shares(n, draw(ProxiedFirst)))
}

// TestTagDuringRollout: a tagged latest target in a gradual rollout is in
// pieces (oldest first), each with the tag: the tag's address follows the
// pieces' shares; a tag at 0 % goes to its newest piece.
func TestTagDuringRollout(t *testing.T) {
	const n = 50_000
	tb := routeFixture(t)
	tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{
		{Revision: "hello-00001", Percent: 36, Tag: "latest"},
		{Revision: "hello-00002", Percent: 19, Tag: "latest"},
		{Revision: "hello-00001", Percent: 45},
		{Revision: "hello-00001", Tag: "old"},
		{Revision: "hello-00003", Tag: "old"},
	}})
	draw := func(host string) func() (string, bool) {
		return func() (string, bool) {
			got, err := tb.resolve("", host, AllRevisions)
			if err != nil {
				t.Fatal(err)
			}
			return got.Key.Name, true
		}
	}
	checkShares(t, n, map[string]float64{"hello-00001": 36.0 / 55, "hello-00002": 19.0 / 55}, shares(n, draw("latest-hello.default")))
	checkShares(t, n, map[string]float64{"hello-00003": 1}, shares(n, draw("old-hello.default")))
}

// TestRouteErrors: a Route that says nowhere to go, and a revision the
// activator does not know, are errors naming the Route and why; nothing
// is chosen in their place.
func TestRouteErrors(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(tb *Table)
		host    string
		wantErr error
		wantMsg string
	}{
		{name: "Route not known", edit: func(tb *Table) { tb.DeleteRoute(key("default", "hello")) }, host: "hello.default",
			wantErr: ErrRouteNotReady, wantMsg: `host "hello.default" names Service default/hello of Route default/hello, which this activator does not know`},
		{name: "no status.traffic", edit: func(tb *Table) { tb.UpsertRoute(Route{Key: key("default", "hello")}) }, host: "10.96.1.1:80",
			wantErr: ErrRouteNotReady, wantMsg: `names Route default/hello, whose status.traffic is empty`},
		{name: "no status.traffic, tag", edit: func(tb *Table) { tb.UpsertRoute(Route{Key: key("default", "hello")}) }, host: "latest-hello.default",
			wantErr: ErrRouteNotReady, wantMsg: `names tag "latest" of Route default/hello, whose status.traffic is empty`},
		{name: "tag not in status.traffic", edit: func(tb *Table) {
			tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{{Revision: "hello-00001", Percent: 100}}})
		}, host: "old-hello.default", wantErr: ErrRouteNotReady, wantMsg: `names tag "old" of Route default/hello, which is not in the Route's status.traffic`},
		{name: "tag without revision", edit: func(tb *Table) {
			tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{{Revision: "hello-00001", Percent: 100}, {Tag: "old"}}})
		}, host: "old-hello.default", wantErr: ErrRouteNotReady, wantMsg: `whose status.traffic entry names no revision`},
		{name: "no percent > 0", edit: func(tb *Table) {
			tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{{Revision: "hello-00001", Tag: "a"}}})
		}, host: "hello.default", wantErr: ErrRouteNotReady, wantMsg: `whose status.traffic has no revision with percent > 0`},
		{name: "revision unknown", edit: func(tb *Table) {
			tb.UpsertRoute(Route{Key: key("default", "hello"), Traffic: []Traffic{{Revision: "hello-00009", Percent: 100}}})
		}, host: "hello.default", wantErr: ErrRevisionUnknown,
			wantMsg: `names Route default/hello, whose revision hello-00009 is no target this activator knows (no PodAutoscaler names a public Service default/hello-00009); not sent elsewhere`},
		{name: "tagged revision unknown", edit: func(tb *Table) { tb.Delete(key("default", "hello-00003")) }, host: "old-hello.default",
			wantErr: ErrRevisionUnknown, wantMsg: `names tag "old" of Route default/hello, whose revision hello-00003 is no target`},
		{name: "port not the Route Service's", host: "hello.default:8080",
			wantErr: ErrNotFound, wantMsg: `host "hello.default:8080" names Service default/hello of Route default/hello, whose ports are [80], not 8080`},
		{name: "tag Service gone", edit: func(tb *Table) { tb.Delete(key("default", "latest-hello")) }, host: "latest-hello.default",
			wantErr: ErrNotFound, wantMsg: "matches no target"},
		{name: "a Route's bare name", host: "hello", wantErr: ErrNotFound, wantMsg: `host "hello" has no namespace`},
		{name: "a tag's bare name", host: "latest-hello:80", wantErr: ErrNotFound, wantMsg: `use latest-hello.<namespace>`},
		{name: "tag Service's ClusterIP gone", edit: func(tb *Table) { tb.Delete(key("default", "latest-hello")) }, host: "10.96.1.2",
			wantErr: ErrNotFound, wantMsg: "is not the ClusterIP of any target's public Service or of a Route's Service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := routeFixture(t)
			if tt.edit != nil {
				tt.edit(tb)
			}
			for _, pick := range []Pick{AllRevisions, ProxiedFirst} {
				got, err := tb.resolve("", tt.host, pick)
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("%s: resolve(%q) = %v, %v; want %v containing %q", pick, tt.host, got, err, tt.wantErr, tt.wantMsg)
				}
			}
		})
	}
}

// TestReaches: the absolute-URI check asks whether a host can lead to a
// target; a Route's own host can lead to each revision with traffic.
func TestReaches(t *testing.T) {
	tb := routeFixture(t)
	tests := []struct {
		host string
		k    target.Key
		want bool
	}{
		{"hello.default", key("default", "hello-00001"), true},
		{"hello.default", key("default", "hello-00002"), true},
		{"hello.default", key("default", "hello-00003"), false}, // 0 %: only its tag
		{"old-hello.default", key("default", "hello-00003"), true},
		{"old-hello.default", key("default", "hello-00001"), false},
		{"hello.default:8080", key("default", "hello-00001"), false},
		{"hello.other", key("default", "hello-00001"), false},
		{"hello-00001.default:80", key("default", "hello-00001"), true},
		{"hello-00001.default:81", key("default", "hello-00001"), false},
		{"hello-00001.default", key("default", "hello-00002"), false},
	}
	for _, tt := range tests {
		if got := tb.Picking(ProxiedFirst).Reaches(tt.host, tt.k); got != tt.want {
			t.Errorf("Reaches(%q, %s) = %v, want %v", tt.host, tt.k, got, tt.want)
		}
	}
}

// TestRouteServiceIndexes: a Service key is a target's or a Route's, the
// last upsert wins; Delete removes either, indexes too.
func TestRouteServiceIndexes(t *testing.T) {
	tb := routeFixture(t)

	// default/latest-hello becomes a target's public Service.
	mustUpsert(t, tb, tgt("default", "latest-hello").IP("10.96.1.2").Obj())
	if got, err := tb.ResolveHost("10.96.1.2"); err != nil || got.Key != key("default", "latest-hello") {
		t.Errorf("10.96.1.2 = %v, %v; want the target default/latest-hello", got, err)
	}
	// And back.
	if err := tb.UpsertRouteService(RouteService{Key: key("default", "latest-hello"), Route: "hello", Tag: "latest"}); err != nil {
		t.Fatal(err)
	}
	if got, err := tb.ResolveHost("latest-hello.default"); err != nil || got.Key != key("default", "hello-00002") {
		t.Errorf("latest-hello.default = %v, %v; want hello-00002", got, err)
	}
	if _, err := tb.ResolveHost("10.96.1.2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("10.96.1.2 after the Service lost it: %v, want ErrNotFound", err)
	}

	for _, k := range []target.Key{key("default", "hello"), key("default", "latest-hello"), key("default", "old-hello"),
		key("default", "hello-00001"), key("default", "hello-00002"), key("default", "hello-00003")} {
		tb.Delete(k)
	}
	if tb.Len() != 0 || len(tb.services) != 0 || len(tb.ips) != 0 || len(tb.hosts) != 0 {
		t.Errorf("empty table keeps indexes: services %v ips %v hosts %v", tb.services, tb.ips, tb.hosts)
	}
}

func TestUpsertRouteServiceValidates(t *testing.T) {
	tb := NewTable("")
	err := tb.UpsertRouteService(RouteService{Key: key("default", "hello"), Ports: []uint16{0}})
	for _, want := range []string{"route Service default/hello", "route: must be set", "port 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("UpsertRouteService error %v does not say %q", err, want)
		}
	}
	if len(tb.services) != 0 {
		t.Error("an invalid route Service was added")
	}
}
