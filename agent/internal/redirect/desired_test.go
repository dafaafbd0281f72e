package redirect

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
)

// sksBuilder makes ServerlessServices for tests:
// sks("hello").Proxy("act-a").Obj() is in place in Proxy mode with act-a.
type sksBuilder struct{ s v1alpha1.ServerlessService }

func sks(name string) *sksBuilder {
	return &sksBuilder{v1alpha1.ServerlessService{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: name, Selector: map[string]string{"app": name}},
	}}
}

func (b *sksBuilder) Namespace(ns string) *sksBuilder { b.s.Namespace = ns; return b }
func (b *sksBuilder) Public(svc string) *sksBuilder   { b.s.Spec.PublicService = svc; return b }
func (b *sksBuilder) Port(p int32) *sksBuilder        { b.s.Spec.Port = p; return b }

// Serve is Serve mode in place (Ready True).
func (b *sksBuilder) Serve() *sksBuilder {
	b.s.Status.Mode, b.s.Status.Activators = v1alpha1.ModeServe, nil
	return b.Ready(metav1.ConditionTrue, "Serving")
}

// Proxy is Proxy mode in place with these activators (Ready True).
func (b *sksBuilder) Proxy(activators ...string) *sksBuilder {
	b.s.Spec.Mode = v1alpha1.ModeProxy
	b.s.Status.Mode, b.s.Status.Activators = v1alpha1.ModeProxy, activators
	return b.Ready(metav1.ConditionTrue, "ScaledToZero")
}

func (b *sksBuilder) Ready(st metav1.ConditionStatus, reason string) *sksBuilder {
	b.s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: st, Reason: reason, Message: reason}}
	return b
}

func (b *sksBuilder) Obj() v1alpha1.ServerlessService { return *b.s.DeepCopy() }

// service makes a public Service with these cluster IPs and ports
// ("80", "53/UDP").
func service(name string, clusterIPs []string, ports ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	s.Spec.ClusterIPs = clusterIPs
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, p := range ports {
		var port int32
		proto := "TCP"
		if _, err := fmt.Sscanf(p, "%d/%s", &port, &proto); err != nil {
			if _, err := fmt.Sscanf(p, "%d", &port); err != nil {
				panic(p)
			}
		}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", port), Port: port, Protocol: corev1.Protocol(proto)})
	}
	return s
}

func services(svcs ...*corev1.Service) map[types.NamespacedName]*corev1.Service {
	out := make(map[types.NamespacedName]*corev1.Service)
	for _, s := range svcs {
		out[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	return out
}

// activators are ready activator pods act-a.. at 10.0.0.1..
var activators = map[string][]netip.Addr{
	"act-a": {netip.MustParseAddr("10.0.0.1")},
	"act-b": {netip.MustParseAddr("10.0.0.2")},
	"act-c": {netip.MustParseAddr("10.0.0.3")},
}

// activators6 are ready activator pods: act-a and act-b dual-stack
// (10.0.0.1 and fd5c:a1e:0:1::1, ...), act-6 IPv6 only, act-4 IPv4 only.
var activators6 = map[string][]netip.Addr{
	"act-a": {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd5c:a1e:0:1::1")},
	"act-b": {netip.MustParseAddr("fd5c:a1e:0:1::2"), netip.MustParseAddr("10.0.0.2")},
	"act-6": {netip.MustParseAddr("fd5c:a1e:0:1::6")},
	"act-4": {netip.MustParseAddr("10.0.0.4")},
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func backends(addrs ...string) []bpfredirect.Backend {
	var out []bpfredirect.Backend
	for _, a := range addrs {
		out = append(out, bpfredirect.Backend{Addr: ap(a), Weight: 1})
	}
	return out
}

var hello = types.NamespacedName{Namespace: "default", Name: "hello"}

func TestCompute(t *testing.T) {
	v4 := []string{"10.96.0.10"}
	tests := []struct {
		name        string
		skses       []v1alpha1.ServerlessService
		svcs        []*corev1.Service
		wantEntries map[netip.AddrPort][]bpfredirect.Backend
		wantSkipped map[Target]string
		// wantTargets: the addresses counted for hello (nil: 10.96.0.10:80).
		wantTargets []netip.AddrPort
	}{{
		name:  "serve mode has no entry, but its address is hello's",
		skses: []v1alpha1.ServerlessService{sks("hello").Serve().Obj()},
		svcs:  []*corev1.Service{service("hello", v4, "80")},
	}, {
		name:  "no status yet: no entry",
		skses: []v1alpha1.ServerlessService{sks("hello").Obj()},
		svcs:  []*corev1.Service{service("hello", v4, "80")},
	}, {
		name:        "proxy with no activator: kube-proxy's path only",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy().Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoActivator},
	}, {
		name:        "proxy with one activator",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-b").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.2:8012")},
	}, {
		name:        "proxy with three activators: equal weights, sorted by address",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-c", "act-a", "act-b").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.1:8012", "10.0.0.2:8012", "10.0.0.3:8012")},
	}, {
		name:        "an activator the agent does not see ready is left out",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a", "act-gone").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.1:8012")},
	}, {
		name:        "no named activator is ready: no entry",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-gone").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoActivator},
	}, {
		name:        "proxy but not Ready: the public endpoints may not be the activators",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Ready(metav1.ConditionFalse, "PublicServiceHasSelector").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNotReady},
	}, {
		name:        "port set: only it goes to the activators",
		skses:       []v1alpha1.ServerlessService{sks("hello").Port(80).Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "9090", "80", "443")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.1:8012")},
		wantTargets: []netip.AddrPort{ap("10.96.0.10:80")},
	}, {
		name:  "port unset: every TCP port, UDP untouched",
		skses: []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		svcs:  []*corev1.Service{service("hello", v4, "80", "53/UDP", "443")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("10.96.0.10:80"): backends("10.0.0.1:8012"), ap("10.96.0.10:443"): backends("10.0.0.1:8012"),
		},
		wantTargets: []netip.AddrPort{ap("10.96.0.10:80"), ap("10.96.0.10:443")},
	}, {
		name:  "port not among the Service's: every port, as the controller's slices",
		skses: []v1alpha1.ServerlessService{sks("hello").Port(8080).Proxy("act-a").Obj()},
		svcs:  []*corev1.Service{service("hello", v4, "80", "443")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("10.96.0.10:80"): backends("10.0.0.1:8012"), ap("10.96.0.10:443"): backends("10.0.0.1:8012"),
		},
		wantTargets: []netip.AddrPort{ap("10.96.0.10:80"), ap("10.96.0.10:443")},
	}, {
		name:        "the served port is UDP: nothing to redirect",
		skses:       []v1alpha1.ServerlessService{sks("hello").Port(53).Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80", "53/UDP")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoTCPPort},
		wantTargets: []netip.AddrPort{},
	}, {
		name:        "headless Service",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", []string{"None"}, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipHeadless},
		wantTargets: []netip.AddrPort{},
	}, {
		name:        "no cluster IP (ExternalName)",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", nil, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoClusterIP},
		wantTargets: []netip.AddrPort{},
	}, {
		name:        "IPv6 only, IPv4 activators: no entry, kube-proxy's path",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", []string{"fd00::10"}, "80")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoActivatorOfFamily},
		wantTargets: []netip.AddrPort{ap("[fd00::10]:80")},
	}, {
		name:        "dual stack, IPv4 activators: the IPv4 address only",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", []string{"fd00::10", "10.96.0.10"}, "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.1:8012")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoActivatorOfFamily},
		wantTargets: []netip.AddrPort{ap("10.96.0.10:80"), ap("[fd00::10]:80")},
	}, {
		name:        "public Service missing",
		skses:       []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj()},
		wantSkipped: map[Target]string{sksTarget(hello): SkipNoService},
		wantTargets: []netip.AddrPort{},
	}, {
		name: "two ServerlessServices name one Service: the first by name has it",
		skses: []v1alpha1.ServerlessService{
			sks("hello").Proxy("act-a").Obj(),
			sks("another").Public("hello").Proxy("act-b").Obj(),
		},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.10:80"): backends("10.0.0.2:8012")},
		wantSkipped: map[Target]string{sksTarget(hello): SkipDuplicate},
		wantTargets: []netip.AddrPort{},
	}, {
		name:        "same names in another namespace do not match",
		skses:       []v1alpha1.ServerlessService{sks("hello").Namespace("other").Proxy("act-a").Obj()},
		svcs:        []*corev1.Service{service("hello", v4, "80")},
		wantSkipped: map[Target]string{sksTarget(types.NamespacedName{Namespace: "other", Name: "hello"}): SkipNoService},
		wantTargets: []netip.AddrPort{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Compute(Inputs{ServerlessServices: tt.skses, Services: services(tt.svcs...), Activators: activators, ActivatorPort: 8012})
			got := make(map[netip.AddrPort][]bpfredirect.Backend)
			for a, e := range d.Entries {
				got[a] = e.Backends
				if e.Target != d.Targets[a] {
					t.Errorf("entry %s is %s's, but the address is counted for %s", a, e.Target, d.Targets[a])
				}
			}
			want := tt.wantEntries
			if want == nil {
				want = map[netip.AddrPort][]bpfredirect.Backend{}
			}
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			wantSkipped := tt.wantSkipped
			if wantSkipped == nil {
				wantSkipped = map[Target]string{}
			}
			if diff := cmp.Diff(wantSkipped, d.Skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			wantTargets := tt.wantTargets
			if wantTargets == nil {
				wantTargets = []netip.AddrPort{ap("10.96.0.10:80")}
			}
			var gotTargets []netip.AddrPort
			for a, key := range d.Targets {
				if key == sksTarget(hello) {
					gotTargets = append(gotTargets, a)
				}
			}
			if diff := cmp.Diff(wantTargets, gotTargets, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
				cmpopts.SortSlices(func(a, b netip.AddrPort) bool { return a.Compare(b) < 0 }), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("addresses counted for hello (-want +got):\n%s", diff)
			}
		})
	}
}

// TestComputeIPv6: each address of the public Service gets the
// activators' addresses of its family; an address whose family no named
// ready activator has is skipped, the others keep their entries.
func TestComputeIPv6(t *testing.T) {
	v6, dual := []string{"fd5c:a1e:96::a"}, []string{"fd5c:a1e:96::a", "10.96.0.10"}
	for _, tt := range []struct {
		name        string
		activators  []string
		clusterIPs  []string
		wantEntries map[netip.AddrPort][]bpfredirect.Backend
		wantSkipped string
	}{{
		name: "IPv6 Service, dual-stack activators: their IPv6 addresses", activators: []string{"act-b", "act-a"}, clusterIPs: v6,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("[fd5c:a1e:96::a]:80"): backends("[fd5c:a1e:0:1::1]:8012", "[fd5c:a1e:0:1::2]:8012")},
	}, {
		name: "IPv6 Service, IPv6-only and IPv4-only activators: the IPv6 one", activators: []string{"act-4", "act-6"}, clusterIPs: v6,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("[fd5c:a1e:96::a]:80"): backends("[fd5c:a1e:0:1::6]:8012")},
	}, {
		name: "IPv6 Service, IPv4-only activator", activators: []string{"act-4"}, clusterIPs: v6,
		wantSkipped: SkipNoActivatorOfFamily,
	}, {
		name: "dual-stack Service, dual-stack activators: an entry per family", activators: []string{"act-a", "act-b"}, clusterIPs: dual,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("[fd5c:a1e:96::a]:80"): backends("[fd5c:a1e:0:1::1]:8012", "[fd5c:a1e:0:1::2]:8012"),
			ap("10.96.0.10:80"):       backends("10.0.0.1:8012", "10.0.0.2:8012"),
		},
	}, {
		name: "dual-stack Service, activators of either family", activators: []string{"act-6", "act-4"}, clusterIPs: dual,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("[fd5c:a1e:96::a]:80"): backends("[fd5c:a1e:0:1::6]:8012"),
			ap("10.96.0.10:80"):       backends("10.0.0.4:8012"),
		},
	}, {
		name: "dual-stack Service, IPv6-only activator: the IPv4 address is skipped", activators: []string{"act-6"}, clusterIPs: dual,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("[fd5c:a1e:96::a]:80"): backends("[fd5c:a1e:0:1::6]:8012")},
		wantSkipped: SkipNoActivatorOfFamily,
	}, {
		name: "no named activator is ready", activators: []string{"act-gone"}, clusterIPs: dual,
		wantSkipped: SkipNoActivator,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			d := Compute(Inputs{
				ServerlessServices: []v1alpha1.ServerlessService{sks("hello").Proxy(tt.activators...).Obj()},
				Services:           services(service("hello", tt.clusterIPs, "80")),
				Activators:         activators6, ActivatorPort: 8012,
			})
			got := make(map[netip.AddrPort][]bpfredirect.Backend)
			for a, e := range d.Entries {
				got[a] = e.Backends
			}
			want := tt.wantEntries
			if want == nil {
				want = map[netip.AddrPort][]bpfredirect.Backend{}
			}
			if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			wantSkipped := map[Target]string{}
			if tt.wantSkipped != "" {
				wantSkipped[sksTarget(hello)] = tt.wantSkipped
			}
			if diff := cmp.Diff(wantSkipped, d.Skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
		})
	}
}

func TestComputeCapsBackends(t *testing.T) {
	acts := make(map[string][]netip.Addr)
	var names []string
	for i := range 40 {
		n := fmt.Sprintf("act-%02d", i)
		acts[n] = []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 1, byte(40 - i)})}
		names = append(names, n)
	}
	d := Compute(Inputs{
		ServerlessServices: []v1alpha1.ServerlessService{sks("hello").Proxy(names...).Obj()},
		Services:           services(service("hello", []string{"10.96.0.10"}, "80")),
		Activators:         acts, ActivatorPort: 8012,
	})
	got := d.Entries[ap("10.96.0.10:80")].Backends
	if len(got) != bpfredirect.MaxBackends {
		t.Fatalf("%d backends, want the map's limit %d", len(got), bpfredirect.MaxBackends)
	}
	if got[0].Addr != ap("10.0.1.1:8012") || got[31].Addr != ap("10.0.1.32:8012") {
		t.Errorf("backends %v .. %v, want the 32 lowest addresses 10.0.1.1 .. 10.0.1.32", got[0].Addr, got[31].Addr)
	}
}

func TestIsReadyActivator(t *testing.T) {
	// pod's ips are status.podIPs, the first also status.podIP.
	pod := func(phase corev1.PodPhase, ready corev1.ConditionStatus, deleting bool, ips ...string) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0]
		}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{}
		}
		return p
	}
	podIPOnly := pod(corev1.PodRunning, corev1.ConditionTrue, false)
	podIPOnly.Status.PodIP = "fd00::1"
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	tests := []struct {
		name      string
		pod       *corev1.Pod
		want      bool
		wantAddrs []netip.Addr
	}{
		{"running and ready", pod(corev1.PodRunning, corev1.ConditionTrue, false, "10.0.0.1"), true, addrs("10.0.0.1")},
		{"not ready", pod(corev1.PodRunning, corev1.ConditionFalse, false, "10.0.0.1"), false, nil},
		{"being deleted", pod(corev1.PodRunning, corev1.ConditionTrue, true, "10.0.0.1"), false, nil},
		{"pending", pod(corev1.PodPending, corev1.ConditionTrue, false, "10.0.0.1"), false, nil},
		{"no address", pod(corev1.PodRunning, corev1.ConditionTrue, false), false, nil},
		{"IPv6", pod(corev1.PodRunning, corev1.ConditionTrue, false, "fd00::1"), true, addrs("fd00::1")},
		{"dual-stack, IPv6 first", pod(corev1.PodRunning, corev1.ConditionTrue, false, "fd00::1", "10.0.0.1"), true, addrs("fd00::1", "10.0.0.1")},
		{"IPv4-mapped is IPv4, repeated once", pod(corev1.PodRunning, corev1.ConditionTrue, false, "::ffff:10.0.0.1", "10.0.0.1"), true, addrs("10.0.0.1")},
		{"unusable addresses skipped", pod(corev1.PodRunning, corev1.ConditionTrue, false, "garbage", "::", "fe80::1%eth0", "fd00::1"), true, addrs("fd00::1")},
		{"only unusable addresses", pod(corev1.PodRunning, corev1.ConditionTrue, false, "garbage"), false, nil},
		{"podIP without podIPs", podIPOnly, true, addrs("fd00::1")},
	}
	for _, tt := range tests {
		got, ok := isReadyActivator(tt.pod)
		if ok != tt.want {
			t.Errorf("%s: ready activator = %v, want %v", tt.name, ok, tt.want)
		}
		if !ok {
			continue
		}
		if diff := cmp.Diff(tt.wantAddrs, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: addresses (-want +got):\n%s", tt.name, diff)
		}
	}
}
