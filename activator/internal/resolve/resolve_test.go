package resolve

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// tgt builds a target: tgt("default", "hello").IP("10.96.0.10").Ports(80).Obj().
type tgtBuilder struct{ t target.Target }

func tgt(ns, name string) *tgtBuilder {
	return &tgtBuilder{t: target.Target{Key: target.Key{Namespace: ns, Name: name}}}
}

func (b *tgtBuilder) IP(ips ...string) *tgtBuilder {
	for _, s := range ips {
		b.t.ClusterIPs = append(b.t.ClusterIPs, netip.MustParseAddr(s))
	}
	return b
}
func (b *tgtBuilder) Ports(p ...uint16) *tgtBuilder { b.t.Ports = p; return b }
func (b *tgtBuilder) Hosts(h ...string) *tgtBuilder { b.t.Hosts = h; return b }
func (b *tgtBuilder) Obj() target.Target            { return b.t }
func key(ns, name string) target.Key                { return target.Key{Namespace: ns, Name: name} }
func mustUpsert(t testing.TB, tb *Table, x target.Target) {
	t.Helper()
	if err := tb.Upsert(x); err != nil {
		t.Fatal(err)
	}
}

func fixture(t testing.TB) *Table {
	tb := NewTable("") // cluster.local
	mustUpsert(t, tb, tgt("default", "hello").IP("10.96.0.10", "fd00::10").Ports(80, 8080).Hosts("Hello.Example.COM.", "shop.example.com", "Intranet").Obj())
	mustUpsert(t, tb, tgt("team-a", "api").IP("10.96.0.20").Obj())
	mustUpsert(t, tb, tgt("team-b", "api").IP("10.96.0.21").Ports(80).Hosts("shop.example.com").Obj())
	mustUpsert(t, tb, tgt("default", "grpc").Obj()) // headless: no ClusterIP, any port
	return tb
}

func TestResolve(t *testing.T) {
	tb := fixture(t)
	tests := []struct {
		name, header, host string
		want               target.Key
		wantErr            error
		wantMsg            string // substring of the error
	}{
		// 1. The header wins over the host, and is the only thing tried.
		{name: "header", header: "team-a/api", host: "hello", want: key("team-a", "api")},
		{name: "header unknown", header: "default/nope", host: "hello", wantErr: ErrNotFound, wantMsg: `Sockscale-Target "default/nope" names no target`},
		{name: "header malformed", header: "hello", wantErr: ErrBadHeader, wantMsg: `want <namespace>/<name>`},
		{name: "header with extra slash", header: "a/b/c", wantErr: ErrBadHeader},

		// 2. Every DNS form of the public Service.
		{name: "name.ns", host: "hello.default", want: key("default", "hello")},
		{name: "name.ns.svc", host: "hello.default.svc", want: key("default", "hello")},
		{name: "fqdn", host: "hello.default.svc.cluster.local", want: key("default", "hello")},
		{name: "fqdn, trailing dot, upper case, port", host: "HELLO.default.SVC.cluster.local.:8080", want: key("default", "hello")},
		{name: "name.ns with port", host: "hello.default:80", want: key("default", "hello")},
		{name: "port not of the Service", host: "hello.default:81", wantErr: ErrNotFound, wantMsg: `whose ports are [80 8080], not 81`},
		{name: "Service with no ports listed takes any", host: "grpc.default:50051", want: key("default", "grpc")},
		{name: "other cluster domain", host: "hello.default.svc.example.org", wantErr: ErrNotFound},
		{name: "svc without namespace", host: "hello.svc", wantErr: ErrNotFound},
		// A name alone never resolves: the client's namespace is unknown.
		{name: "bare name, one namespace has it", host: "hello", wantErr: ErrNotFound,
			wantMsg: `host "hello" has no namespace: the activator serves every namespace and cannot know the client's, so a name alone never resolves; use hello.<namespace> (or hello.<namespace>.svc.cluster.local) or the Sockscale-Target header`},
		{name: "bare name with port", host: "hello:8080", wantErr: ErrNotFound, wantMsg: `host "hello:8080" has no namespace`},
		{name: "bare name, upper case, trailing dot", host: "HELLO.", wantErr: ErrNotFound, wantMsg: `use hello.<namespace>`},
		{name: "bare name in two namespaces", host: "api", wantErr: ErrNotFound, wantMsg: `host "api" has no namespace`},
		{name: "bare name nobody has", host: "nope", wantErr: ErrNotFound, wantMsg: `host "nope" has no namespace`},
		{name: "one-label route host", host: "intranet", wantErr: ErrNotFound, wantMsg: `host "intranet" has no namespace`},
		{name: "api.team-b", host: "api.team-b:80", want: key("team-b", "api")},

		// ClusterIPs, both families.
		{name: "ClusterIP", host: "10.96.0.10", want: key("default", "hello")},
		{name: "ClusterIP:port", host: "10.96.0.10:8080", want: key("default", "hello")},
		{name: "ClusterIP, wrong port", host: "10.96.0.10:9", wantErr: ErrNotFound, wantMsg: "not 9"},
		{name: "IPv6 ClusterIP", host: "[fd00::10]:80", want: key("default", "hello")},
		{name: "IPv6 ClusterIP, brackets, no port", host: "[fd00::10]", want: key("default", "hello")},
		{name: "IPv6 ClusterIP, bare", host: "fd00::10", want: key("default", "hello")},
		{name: "unknown IP", host: "10.0.0.1:80", wantErr: ErrNotFound, wantMsg: "not the ClusterIP of any target"},

		// 3. Route hosts: port not checked; shared ones are ambiguous.
		{name: "route host", host: "hello.example.com:443", want: key("default", "hello")},
		{name: "route host shared by two targets", host: "shop.example.com", wantErr: ErrAmbiguous, wantMsg: "default/hello, team-b/api"},

		{name: "unknown host", host: "example.org", wantErr: ErrNotFound, wantMsg: `host "example.org" matches no target: tried ClusterIPs, Service names (name.ns, name.ns.svc, name.ns.svc.cluster.local) and route hosts`},
		{name: "no header, no host", wantErr: ErrNotFound, wantMsg: "neither"},
		{name: "bad port", host: "hello:http", wantErr: ErrNotFound, wantMsg: "not a number"},
		{name: "port 0", host: "hello:0", wantErr: ErrNotFound},
		{name: "empty host with port", host: ":80", wantErr: ErrNotFound, wantMsg: "empty host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tb.Resolve(tt.header, tt.host)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("Resolve(%q, %q) error = %v; want %v containing %q", tt.header, tt.host, err, tt.wantErr, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q, %q): %v", tt.header, tt.host, err)
			}
			if diff := cmp.Diff(tt.want, got.Key); diff != "" {
				t.Errorf("Resolve(%q, %q) (-want +got):\n%s", tt.header, tt.host, diff)
			}
		})
	}
}

func TestUpsertReplacesAndDeleteUnindexes(t *testing.T) {
	tb := fixture(t)
	// hello moves to a new ClusterIP and loses its route hosts.
	mustUpsert(t, tb, tgt("default", "hello").IP("10.96.0.99").Obj())
	for _, host := range []string{"10.96.0.10", "hello.example.com"} {
		if _, err := tb.ResolveHost(host); !errors.Is(err, ErrNotFound) {
			t.Errorf("after replace, %q: error %v, want ErrNotFound", host, err)
		}
	}
	// shop.example.com is team-b's alone now.
	if got, err := tb.ResolveHost("shop.example.com"); err != nil || got.Key != key("team-b", "api") {
		t.Errorf("shop.example.com = %v, %v; want team-b/api", got, err)
	}
	tb.Delete(key("team-a", "api"))
	if _, err := tb.ResolveHost("10.96.0.20"); !errors.Is(err, ErrNotFound) {
		t.Errorf("10.96.0.20 after delete: %v, want ErrNotFound", err)
	}
	tb.Delete(key("team-a", "api")) // twice: no-op
	tb.Delete(key("default", "hello"))
	tb.Delete(key("team-b", "api"))
	tb.Delete(key("default", "grpc"))
	if tb.Len() != 0 || len(tb.ips) != 0 || len(tb.hosts) != 0 {
		t.Errorf("empty table keeps indexes: ips %v hosts %v", tb.ips, tb.hosts)
	}
}

func TestReusedClusterIPKeepsNewOwner(t *testing.T) {
	tb := NewTable("")
	mustUpsert(t, tb, tgt("a", "old").IP("10.96.0.5").Obj())
	mustUpsert(t, tb, tgt("b", "new").IP("10.96.0.5").Obj()) // old deleted in the cluster, event not seen yet
	tb.Delete(key("a", "old"))
	if got, err := tb.ResolveHost("10.96.0.5"); err != nil || got.Key != key("b", "new") {
		t.Errorf("10.96.0.5 = %v, %v; want b/new", got, err)
	}
}

func TestUpsertValidates(t *testing.T) {
	tb := NewTable("")
	bad := tgt("default", "hello").Obj()
	bad.ContainerConcurrency = -1
	bad.Timeout = 601e9
	err := tb.Upsert(bad)
	for _, want := range []string{"target default/hello", "containerConcurrency -1", "timeout 10m1s: must be from 0 (default 5m0s) to 10m0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Upsert error %v does not say %q", err, want)
		}
	}
	if tb.Len() != 0 {
		t.Error("an invalid target was added")
	}
}

// TestBareNamesDoNotDependOnOtherTenants: what a name alone gets, and
// what team-a's own forms get, is the same whatever targets and Routes
// other namespaces have (before, team-b creating a target "hello" turned
// team-a's working "Host: hello" calls into 404s).
func TestBareNamesDoNotDependOnOtherTenants(t *testing.T) {
	type result struct{ Key, Err string }
	resolveAll := func(tb *Table) map[string]result {
		out := map[string]result{}
		for _, host := range []string{"hello", "hello:80", "hello.team-a", "hello.team-a:80", "hello.team-a.svc", "hello.team-a.svc.cluster.local"} {
			got, err := tb.ResolveHost(host)
			var r result
			if err != nil {
				r.Err = err.Error()
			} else {
				r.Key = got.Key.String()
			}
			out[host] = r
		}
		return out
	}
	base := NewTable("")
	mustUpsert(t, base, tgt("team-a", "hello").Ports(80).Obj())
	want := resolveAll(base)
	noNS := `no such target: host "hello" has no namespace: the activator serves every namespace and cannot know the client's, so a name alone never resolves; use hello.<namespace> (or hello.<namespace>.svc.cluster.local) or the Sockscale-Target header`
	if diff := cmp.Diff(result{Err: noNS}, want["hello"]); diff != "" {
		t.Errorf("hello, team-a alone (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(result{Key: "team-a/hello"}, want["hello.team-a.svc"]); diff != "" {
		t.Errorf("hello.team-a.svc, team-a alone (-want +got):\n%s", diff)
	}

	for name, others := range map[string]func(tb *Table){
		"team-b has a target hello": func(tb *Table) { mustUpsert(t, tb, tgt("team-b", "hello").Obj()) },
		"team-b and team-c have one": func(tb *Table) {
			mustUpsert(t, tb, tgt("team-b", "hello").Obj())
			mustUpsert(t, tb, tgt("team-c", "hello").Obj())
		},
		"team-b has a Route hello": func(tb *Table) {
			if err := tb.UpsertRouteService(RouteService{Key: key("team-b", "hello"), Route: "hello"}); err != nil {
				t.Fatal(err)
			}
		},
		"team-b's route claims the host hello": func(tb *Table) { mustUpsert(t, tb, tgt("team-b", "web").Hosts("hello").Obj()) },
	} {
		t.Run(name, func(t *testing.T) {
			tb := NewTable("")
			mustUpsert(t, tb, tgt("team-a", "hello").Ports(80).Obj())
			others(tb)
			if diff := cmp.Diff(want, resolveAll(tb)); diff != "" {
				t.Errorf("team-a's hosts change with another namespace's objects (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCustomClusterDomain(t *testing.T) {
	tb := NewTable("Corp.Internal.")
	mustUpsert(t, tb, tgt("default", "hello").Obj())
	if _, err := tb.ResolveHost("hello.default.svc.corp.internal"); err != nil {
		t.Error(err)
	}
	if _, err := tb.ResolveHost("hello.default.svc.cluster.local"); !errors.Is(err, ErrNotFound) {
		t.Errorf("cluster.local under another domain: %v, want ErrNotFound", err)
	}
}

// FuzzResolveHost: whatever the host, resolution never panics, and a host
// that resolves is one of the target's forms.
func FuzzResolveHost(f *testing.F) {
	for _, s := range []string{"hello", "hello.default:80", "10.96.0.10:8080", "[fd00::10]:80", "HELLO.default.svc.cluster.local.",
		"shop.example.com", "api", ":", "[", "[]:80", "a.b.c.d.e", "hello.default.svc.cluster.local.:65536"} {
		f.Add(s)
	}
	tb := fixture(f)
	f.Fuzz(func(t *testing.T, host string) {
		got, err := tb.ResolveHost(host)
		if err != nil {
			if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrAmbiguous) {
				t.Fatalf("%q: error %v is neither ErrNotFound nor ErrAmbiguous", host, err)
			}
			return
		}
		name, _, err := splitHostPort(host)
		if err != nil {
			t.Fatalf("%q resolved to %s but does not parse: %v", host, got.Key, err)
		}
		k := got.Key
		forms := []string{k.Name + "." + k.Namespace, k.Name + "." + k.Namespace + ".svc", k.Name + "." + k.Namespace + ".svc.cluster.local"}
		forms = append(forms, got.Hosts...)
		for _, ip := range got.ClusterIPs {
			forms = append(forms, ip.String())
		}
		if ip, err := netip.ParseAddr(name); err == nil {
			name = ip.Unmap().String()
		}
		if !strings.Contains(name, ".") && !strings.Contains(name, ":") {
			t.Fatalf("%q resolved to %s: a name without a dot never resolves", host, k)
		}
		for _, f := range forms {
			if name == f {
				return
			}
		}
		t.Fatalf("%q resolved to %s, but %q is none of its forms %q", host, k, name, forms)
	})
}

// TestServeSince: the time a target entered Serve mode is kept across
// Upserts that keep it there, and starts again after any other mode, a
// Delete, or its key becoming a Route's Service.
func TestServeSince(t *testing.T) {
	tb := NewTable("")
	now := time.Unix(1000, 0)
	tb.now = func() time.Time { return now }
	hello := key("default", "hello")
	mode := func(proxy, serve bool) target.Target {
		x := tgt("default", "hello").IP("10.96.0.10").Obj()
		x.Proxy, x.Serve = proxy, serve
		return x
	}
	check := func(what string, wantSince time.Time, wantOK bool) {
		t.Helper()
		since, ok := tb.ServeSince(hello)
		if ok != wantOK || !since.Equal(wantSince) {
			t.Errorf("%s: ServeSince = %v, %v; want %v, %v", what, since, ok, wantSince, wantOK)
		}
	}
	check("unknown", time.Time{}, false)
	mustUpsert(t, tb, mode(true, false))
	check("proxy", time.Time{}, false)
	mustUpsert(t, tb, mode(false, false))
	check("neither", time.Time{}, false)

	entered := now
	mustUpsert(t, tb, mode(false, true))
	check("serve", entered, true)
	now = now.Add(time.Minute)
	mustUpsert(t, tb, mode(false, true)) // another change: pods, hosts
	check("serve again", entered, true)

	mustUpsert(t, tb, mode(true, false))
	check("back to proxy", time.Time{}, false)
	now = now.Add(time.Second)
	mustUpsert(t, tb, mode(false, true))
	check("serve after proxy", now, true)

	tb.Delete(hello)
	check("deleted", time.Time{}, false)
	now = now.Add(time.Second)
	mustUpsert(t, tb, mode(false, true))
	check("serve after delete", now, true)
	if err := tb.UpsertRouteService(RouteService{Key: hello, Route: "hello"}); err != nil {
		t.Fatal(err)
	}
	check("a Route's Service now", time.Time{}, false)

	if err := tb.Upsert(mode(true, true)); err == nil {
		t.Error("a target in Proxy and Serve mode at once was taken")
	}
}
