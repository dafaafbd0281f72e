package netpol

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// podObj builds a Pod.
type podObj struct{ corev1.Pod }

func pod(ns, name, ip string, kv ...string) *podObj {
	p := &podObj{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Labels[kv[i]] = kv[i+1]
	}
	return p
}

func (p *podObj) Phase(ph corev1.PodPhase) *podObj { p.Status.Phase = ph; return p }
func (p *podObj) HostNetwork() *podObj             { p.Spec.HostNetwork = true; return p }
func (p *podObj) Obj() *corev1.Pod                 { return &p.Pod }

func ns(name string, kv ...string) *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	return n
}

func objPolicy(p *pol) *networkingv1.NetworkPolicy { o := p.Obj(); return &o }

var helloKey = target.Key{Namespace: "team", Name: "hello"}

// A request for team/hello's pod 10.244.1.7:8080, whose namespace admits
// only pods labelled role=frontend of its own namespace.
func TestAdmitterAdmit(t *testing.T) {
	base := []client.Object{
		ns("team"), ns("shop"),
		pod("team", "hello-1", "10.244.1.7", "app", "hello").Obj(),
		objPolicy(policy("fe").Selecting("app", "hello").Ingress(rule(peers(pods("role", "frontend"))))),
	}
	tests := []struct {
		name   string
		objs   []client.Object // besides base
		client string
		dest   string
		want   error // nil, ErrDenied or ErrUndecided
	}{
		{name: "a frontend pod", objs: []client.Object{pod("team", "fe", "10.244.2.1", "role", "frontend").Obj()}, client: "10.244.2.1"},
		{name: "another pod", objs: []client.Object{pod("team", "batch", "10.244.2.2", "role", "batch").Obj()}, client: "10.244.2.2", want: ErrDenied},
		{name: "a frontend label in another namespace", objs: []client.Object{pod("shop", "fe", "10.244.2.3", "role", "frontend").Obj()}, client: "10.244.2.3", want: ErrDenied},
		{name: "an address that is no pod", client: "192.168.1.1", want: ErrDenied},
		{name: "an IPv4-mapped IPv6 address is its IPv4 one", objs: []client.Object{pod("team", "fe", "10.244.2.1", "role", "frontend").Obj()}, client: "::ffff:10.244.2.1"},
		{
			name: "a node address is never a host-network pod's",
			objs: []client.Object{pod("team", "fe-host", "172.18.0.2", "role", "frontend").HostNetwork().Obj()}, client: "172.18.0.2", want: ErrDenied,
		},
		{
			name: "a pod that ended does not lend its address",
			objs: []client.Object{
				pod("team", "old-fe", "10.244.2.5", "role", "frontend").Phase(corev1.PodSucceeded).Obj(),
				pod("team", "new-batch", "10.244.2.5", "role", "batch").Obj(),
			},
			client: "10.244.2.5", want: ErrDenied,
		},
		{
			name: "a running pod wins over a pending one with its address",
			objs: []client.Object{
				pod("team", "fe", "10.244.2.6", "role", "frontend").Obj(),
				pod("team", "batch", "10.244.2.6", "role", "batch").Phase(corev1.PodPending).Obj(),
			},
			client: "10.244.2.6",
		},
		{
			name: "two live pods with one address: admitted only if both are",
			objs: []client.Object{
				pod("team", "fe", "10.244.2.7", "role", "frontend").Obj(),
				pod("team", "batch", "10.244.2.7", "role", "batch").Obj(),
			},
			client: "10.244.2.7", want: ErrDenied,
		},
		{
			name: "two live pods with one address, both admitted",
			objs: []client.Object{
				pod("team", "fe", "10.244.2.8", "role", "frontend").Obj(),
				pod("team", "fe2", "10.244.2.8", "role", "frontend").Obj(),
			},
			client: "10.244.2.8",
		},
		{
			name:   "IPv6 addresses as netip spells them",
			objs:   []client.Object{pod("team", "fe6", "fd00:0:0::21", "role", "frontend").Obj()},
			client: "fd00::21",
		},
		{name: "a destination pod not in the cache yet", client: "10.244.2.1", dest: "10.244.1.99:8080", want: ErrUndecided},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestAdmitter(t, append(append([]client.Object{}, base...), tt.objs...)...)
			dest := tt.dest
			if dest == "" {
				dest = "10.244.1.7:8080"
			}
			err := a.Admit(context.Background(), netip.MustParseAddr(tt.client), helloKey, netip.MustParseAddrPort(dest))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Admit = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestAdmitterNoPolicyNoPodNeeded(t *testing.T) {
	// No policy in the namespace: admitted without looking the pods up,
	// even one the cache does not have yet.
	a := newTestAdmitter(t, ns("team"))
	if err := a.Admit(context.Background(), netip.MustParseAddr("192.168.1.1"), helloKey, netip.MustParseAddrPort("10.244.1.99:8080")); err != nil {
		t.Errorf("Admit = %v, want nil", err)
	}
}

func TestAdmitterUndecidedUntilSynced(t *testing.T) {
	a := New(Options{Reader: newReader(t)})
	err := a.Admit(context.Background(), netip.MustParseAddr("10.244.2.1"), helloKey, netip.MustParseAddrPort("10.244.1.7:8080"))
	if !errors.Is(err, ErrUndecided) {
		t.Errorf("Admit before Run = %v, want ErrUndecided", err)
	}
}

func TestAdmitterDenialMessageAndMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := New(Options{Reader: newReader(t, ns("team"), pod("team", "hello-1", "10.244.1.7", "app", "hello").Obj(),
		pod("shop", "curl", "10.244.3.3").Obj(), objPolicy(policy("deny").Selecting())), Registerer: reg})
	a.synced.Store(true)
	err := a.Admit(context.Background(), netip.MustParseAddr("10.244.3.3"), helloKey, netip.MustParseAddrPort("10.244.1.7:8080"))
	want := "client 10.244.3.3 (pod shop/curl) may not reach team/hello (pod hello-1, port 8080): the target's NetworkPolicies do not admit it"
	if err == nil || err.Error() != want {
		t.Errorf("Admit = %v, want %q", err, want)
	}
	if diff := cmp.Diff(1.0, testutil.ToFloat64(a.m.denials.WithLabelValues("team"))); diff != "" {
		t.Errorf("denials of team (-want +got):\n%s", diff)
	}
}

func newReader(t *testing.T, objs ...client.Object) client.Reader {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).
		WithIndex(&corev1.Pod{}, PodIPField, PodIPs).Build()
}

// newTestAdmitter is an Admitter synced on a fake cache holding objs.
func newTestAdmitter(t *testing.T, objs ...client.Object) *Admitter {
	t.Helper()
	return New(Options{Reader: newReader(t, objs...), Synced: func() bool { return true }})
}
