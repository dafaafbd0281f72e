package sks

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// fixture is a public Service hello with ports http 80 and metrics 9090,
// its private Service's slice with the pods, one ready activator, and
// the ServerlessService.
type fixture struct {
	sks     *v1alpha1.ServerlessService
	public  *corev1.Service
	private []client.Object
	extra   []client.Object
}

func newFixture(mode v1alpha1.Mode, port int32, pods ...discoveryv1.Endpoint) *fixture {
	return &fixture{
		sks: &v1alpha1.ServerlessService{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
			Spec:       v1alpha1.ServerlessServiceSpec{Mode: mode, NumActivators: 1, PublicService: "hello", Port: port, Selector: map[string]string{"app": "hello"}},
		},
		public: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}}}},
		private: []client.Object{&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-private-abcde",
				Labels: map[string]string{discoveryv1.LabelServiceName: "hello-private", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)},
				{Name: ptr.To("metrics"), Port: ptr.To(int32(9091)), Protocol: ptr.To(corev1.ProtocolTCP)},
			},
			Endpoints: pods,
		}},
		extra: []client.Object{&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: "activator-0", Labels: map[string]string{"app": "activator"}},
			Status:     corev1.PodStatus{PodIP: "10.0.2.10", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}},
	}
}

func pod(ip string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
}

// run reconciles the fixture once and returns the public Service's
// slices (name, ports as "name:port", endpoints), sorted by name.
func (f *fixture) run(t *testing.T) (client.Client, []discoveryv1.EndpointSlice) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	objs := append(append([]client.Object{f.sks, f.public}, f.private...), f.extra...)
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
	r := &ServerlessService{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}
	return c, publicSlices(t, c)
}

func publicSlices(t *testing.T, c client.Client) []discoveryv1.EndpointSlice {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := c.List(context.Background(), &list, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

// summary is a slice as "port name:number" and its addresses.
type summary struct {
	Ports, Addresses []string
}

func summarize(slices []discoveryv1.EndpointSlice) []summary {
	var out []summary
	for _, s := range slices {
		var sum summary
		for _, p := range s.Ports {
			sum.Ports = append(sum.Ports, ptr.Deref(p.Name, "")+":"+strconv.Itoa(int(ptr.Deref(p.Port, 0))))
		}
		for _, e := range s.Endpoints {
			sum.Addresses = append(sum.Addresses, e.Addresses...)
		}
		out = append(out, sum)
	}
	return out
}

// TestProxyModeSendsOnlyTheServedPortToTheActivator: spec.port says which
// port the target serves; in Proxy mode only it goes to the activators'
// port, the other ports still reach the pods.
func TestProxyModeSendsOnlyTheServedPortToTheActivator(t *testing.T) {
	tests := []struct {
		name string
		mode v1alpha1.Mode
		port int32
		want []summary
	}{
		{"Proxy, port 80: http to the activator, metrics to the pods", v1alpha1.ModeProxy, 80, []summary{
			{Ports: []string{"http:8012"}, Addresses: []string{"10.0.2.10"}},
			{Ports: []string{"metrics:9091"}, Addresses: []string{"10.0.1.1"}},
		}},
		{"Proxy, no port: every port to the activator", v1alpha1.ModeProxy, 0, []summary{
			{Ports: []string{"http:8012", "metrics:8012"}, Addresses: []string{"10.0.2.10"}},
		}},
		{"Serve: the pods on their ports", v1alpha1.ModeServe, 80, []summary{
			{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"10.0.1.1"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := newFixture(tt.mode, tt.port, pod("10.0.1.1", true)).run(t)
			if diff := cmp.Diff(tt.want, summarize(got)); diff != "" {
				t.Errorf("public slices (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServeModeMirrorsConditionsAndHints: the public slices carry the
// private ones' endpoints as they are, conditions and topology hints
// included, so kube-proxy treats the public Service as it would a
// selector Service: terminating endpoints still serving take over when no
// endpoint is ready, and topology-aware routing keeps its zones.
func TestServeModeMirrorsConditionsAndHints(t *testing.T) {
	ready := pod("10.0.1.1", true)
	ready.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	ready.Zone, ready.NodeName = ptr.To("zone-a"), ptr.To("node-a")
	draining := discoveryv1.Endpoint{Addresses: []string{"10.0.1.2"},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}}
	starting := discoveryv1.Endpoint{Addresses: []string{"10.0.1.3"},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}}

	_, got := newFixture(v1alpha1.ModeServe, 0, ready, draining, starting).run(t)
	if len(got) != 1 {
		t.Fatalf("%d public slices, want 1", len(got))
	}
	if diff := cmp.Diff([]discoveryv1.Endpoint{ready, draining, starting}, got[0].Endpoints); diff != "" {
		t.Errorf("public endpoints (-want +got):\n%s", diff)
	}

	// Only draining pods: no ready one, so the activator takes the traffic.
	c, got := newFixture(v1alpha1.ModeServe, 0, draining).run(t)
	if diff := cmp.Diff([]summary{{Ports: []string{"http:8012", "metrics:8012"}, Addresses: []string{"10.0.2.10"}}}, summarize(got)); diff != "" {
		t.Errorf("with no ready pod (-want +got):\n%s", diff)
	}
	var sks v1alpha1.ServerlessService
	_ = c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello"}, &sks)
	if sks.Status.Mode != v1alpha1.ModeProxy {
		t.Errorf("mode %s, want Proxy (forced: no ready pod)", sks.Status.Mode)
	}
}

// TestLeftoverSlicesOfARemovedSelector: a public Service that had a
// selector keeps the slices Kubernetes wrote for it, pointing at whatever
// pods were there; Kubernetes no longer manages them once the selector is
// gone. sockscale takes them over (removes them once its own are
// written); slices of any other manager are reported with the command
// that removes them.
func TestLeftoverSlicesOfARemovedSelector(t *testing.T) {
	leftover := func(name, manager string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
				Labels: map[string]string{discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: manager}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{pod("10.0.9.9", true)},
		}
	}
	tests := []struct {
		name      string
		slice     *discoveryv1.EndpointSlice
		wantGone  bool
		wantInMsg string
	}{
		{"Kubernetes' EndpointSlice controller: taken over", leftover("hello-x7k2p", "endpointslice-controller.k8s.io"), true, ""},
		{"mirrored from an Endpoints object: reported", leftover("hello-mirror", "endpointslicemirroring-controller.k8s.io"),
			false, "kubectl -n default delete endpoints hello"},
		{"another manager: reported", leftover("hello-manual", "someone"),
			false, "kubectl -n default delete endpointslice hello-manual"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(v1alpha1.ModeServe, 0, pod("10.0.1.1", true))
			f.extra = append(f.extra, tt.slice)
			c, got := f.run(t)
			var names []string
			for _, s := range got {
				names = append(names, s.Name)
			}
			var sks v1alpha1.ServerlessService
			_ = c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello"}, &sks)
			cond := sks.Status.Conditions[0]
			if tt.wantGone {
				if diff := cmp.Diff([]string{"hello-sockscale-0"}, names); diff != "" {
					t.Errorf("public slices (-want +got):\n%s", diff)
				}
				if cond.Status != metav1.ConditionTrue {
					t.Errorf("Ready = %+v, want True", cond)
				}
				return
			}
			if !slices.Contains(names, tt.slice.Name) {
				t.Errorf("the foreign slice was removed: %v", names)
			}
			if cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, tt.wantInMsg) {
				t.Errorf("Ready = %+v, want False saying %q", cond, tt.wantInMsg)
			}
		})
	}
}

// TestSlicesPerFamily: the public Service gets slices of each of its IP
// families and of no other: IPv4 ones under the names they always had,
// IPv6 ones under -sockscale-v6-; in Proxy mode each lists the
// activators' addresses of its family (none when no activator has one:
// no slice, so the family's clients do not bypass the activators), in
// Serve mode the private Service's endpoints of its family. A dual-stack
// pod counts once.
func TestSlicesPerFamily(t *testing.T) {
	type named struct {
		Name  string
		Slice summary
	}
	dualStack := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	tests := []struct {
		name        string
		families    []corev1.IPFamily
		activator   []string // the activator's podIPs
		mode        v1alpha1.Mode
		want        []named
		wantMessage string
	}{
		{"IPv6-only, Proxy", []corev1.IPFamily{corev1.IPv6Protocol}, []string{"fd00:2::10"}, v1alpha1.ModeProxy, []named{
			{"hello-sockscale-v6-0", summary{Ports: []string{"http:8012"}, Addresses: []string{"fd00:2::10"}}},
			{"hello-sockscale-v6-1", summary{Ports: []string{"metrics:9091"}, Addresses: []string{"fd00:1::1"}}},
		}, "Proxy: 1 public endpoints"},
		{"IPv6-only, Serve", []corev1.IPFamily{corev1.IPv6Protocol}, []string{"fd00:2::10"}, v1alpha1.ModeServe, []named{
			{"hello-sockscale-v6-0", summary{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"fd00:1::1"}}},
		}, "Serve: 1 public endpoints"},
		{"dual-stack, Proxy", dualStack, []string{"10.0.2.10", "fd00:2::10"}, v1alpha1.ModeProxy, []named{
			{"hello-sockscale-0", summary{Ports: []string{"http:8012"}, Addresses: []string{"10.0.2.10"}}},
			{"hello-sockscale-1", summary{Ports: []string{"metrics:9091"}, Addresses: []string{"10.0.1.1"}}},
			{"hello-sockscale-v6-0", summary{Ports: []string{"http:8012"}, Addresses: []string{"fd00:2::10"}}},
			{"hello-sockscale-v6-1", summary{Ports: []string{"metrics:9091"}, Addresses: []string{"fd00:1::1"}}},
		}, "Proxy: 1 public endpoints"},
		{"dual-stack, Serve: the pod counted once", dualStack, []string{"10.0.2.10", "fd00:2::10"}, v1alpha1.ModeServe, []named{
			{"hello-sockscale-0", summary{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"10.0.1.1"}}},
			{"hello-sockscale-v6-0", summary{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"fd00:1::1"}}},
		}, "Serve: 1 public endpoints"},
		{"dual-stack, Proxy, IPv4-only activator: no IPv6 way around it", dualStack, []string{"10.0.2.10"}, v1alpha1.ModeProxy, []named{
			{"hello-sockscale-0", summary{Ports: []string{"http:8012"}, Addresses: []string{"10.0.2.10"}}},
			{"hello-sockscale-1", summary{Ports: []string{"metrics:9091"}, Addresses: []string{"10.0.1.1"}}},
			{"hello-sockscale-v6-0", summary{Ports: []string{"metrics:9091"}, Addresses: []string{"fd00:1::1"}}},
		}, "Proxy: 1 public endpoints"},
		{"IPv4-only Service over dual-stack pods: IPv4 slices only", []corev1.IPFamily{corev1.IPv4Protocol}, []string{"10.0.2.10", "fd00:2::10"}, v1alpha1.ModeServe, []named{
			{"hello-sockscale-0", summary{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"10.0.1.1"}}},
		}, "Serve: 1 public endpoints"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := pod("10.0.1.1", true)
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "hello-a"}
			f := newFixture(tt.mode, 80, ep)
			f.public.Spec.IPFamilies = tt.families
			v6 := f.private[0].DeepCopyObject().(*discoveryv1.EndpointSlice)
			v6.Name, v6.AddressType = "hello-private-v6xyz", discoveryv1.AddressTypeIPv6
			v6.Endpoints[0].Addresses = []string{"fd00:1::1"}
			f.private = append(f.private, v6)
			act := f.extra[0].(*corev1.Pod)
			act.Status.PodIP, act.Status.PodIPs = tt.activator[0], nil
			for _, ip := range tt.activator {
				act.Status.PodIPs = append(act.Status.PodIPs, corev1.PodIP{IP: ip})
			}
			// A slice of the IPv6 family from before: stays only while the
			// Service has IPv6.
			f.extra = append(f.extra, &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-sockscale-v6-7", Labels: map[string]string{
					discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: ManagedBy},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ServerlessService", Name: "hello", UID: "sks-uid", Controller: ptr.To(true)}}},
				AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{pod("fd00:9::9", true)}})
			c, got := f.run(t)
			var gotNamed []named
			for i, s := range summarize(got) {
				if got[i].AddressType != endpointsFamily(got[i].Name) {
					t.Errorf("slice %s has address type %s", got[i].Name, got[i].AddressType)
				}
				gotNamed = append(gotNamed, named{got[i].Name, s})
			}
			if diff := cmp.Diff(tt.want, gotNamed); diff != "" {
				t.Errorf("public slices (-want +got):\n%s", diff)
			}
			var sks v1alpha1.ServerlessService
			_ = c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello"}, &sks)
			if c := meta.FindStatusCondition(sks.Status.Conditions, names.ConditionReady); c == nil || c.Message != tt.wantMessage {
				t.Errorf("Ready condition %+v, want the message %q", c, tt.wantMessage)
			}
			var private corev1.Service
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello-private"}, &private); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.families, private.Spec.IPFamilies); diff != "" {
				t.Errorf("private Service's IP families (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServeKeepsActivatorsForAFamilyWithoutReadyPods: Kubernetes writes a
// dual-stack Service's slices of each family one after the other; in
// Serve mode, a family whose pod endpoint is not ready yet keeps the
// activators' slice rather than none, which kube-proxy would refuse. The
// target goes from Proxy to Serve while its pod is ready only in IPv4
// (then in both), and after every write of the public slices each family
// still has a ready endpoint: kube-proxy may sync between any two writes.
func TestServeKeepsActivatorsForAFamilyWithoutReadyPods(t *testing.T) {
	ep := pod("10.0.1.1", true)
	ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "hello-a"}
	f := newFixture(v1alpha1.ModeProxy, 80, ep)
	f.public.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	v6 := f.private[0].DeepCopyObject().(*discoveryv1.EndpointSlice)
	v6.Name, v6.AddressType = "hello-private-v6xyz", discoveryv1.AddressTypeIPv6
	v6.Endpoints[0].Addresses = []string{"fd00:1::1"}
	v6.Endpoints[0].Conditions.Ready = ptr.To(false)
	f.private = append(f.private, v6)
	act := f.extra[0].(*corev1.Pod)
	act.Status.PodIP, act.Status.PodIPs = "10.0.2.10", []corev1.PodIP{{IP: "10.0.2.10"}, {IP: "fd00:2::10"}}

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	var gaps []string
	watching := false // the first slices are written one by one
	// check lists the public slices after a write and notes a family left
	// with no ready endpoint.
	check := func(ctx context.Context, c client.WithWatch, what string) {
		if !watching {
			return
		}
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
			t.Fatal(err)
		}
		ready := map[discoveryv1.AddressType]bool{}
		for _, s := range list.Items {
			ready[s.AddressType] = ready[s.AddressType] || hasReady(s)
		}
		for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
			if !ready[family] && len(list.Items) > 0 {
				gaps = append(gaps, fmt.Sprintf("after %s: no ready %s endpoint", what, family))
			}
		}
	}
	objs := append(append([]client.Object{f.sks, f.public}, f.private...), f.extra...)
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				err := c.Create(ctx, obj, opts...)
				check(ctx, c, "creating "+obj.GetName())
				return err
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				err := c.Update(ctx, obj, opts...)
				check(ctx, c, "updating "+obj.GetName())
				return err
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				err := c.Delete(ctx, obj, opts...)
				check(ctx, c, "deleting "+obj.GetName())
				return err
			},
		}).Build()
	r := &ServerlessService{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	step := func(what string, change func(), want []string) {
		t.Helper()
		change()
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
			t.Fatal(err)
		}
		got := publicSlices(t, c)
		var names []string
		for i, s := range summarize(got) {
			names = append(names, fmt.Sprintf("%s %v %v", got[i].Name, s.Ports, s.Addresses))
		}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("%s: public slices (-want +got):\n%s", what, diff)
		}
	}
	update := func(obj client.Object, change func()) func() {
		return func() {
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
				t.Fatal(err)
			}
			change()
			if err := c.Update(context.Background(), obj); err != nil {
				t.Fatal(err)
			}
		}
	}
	step("proxy", func() {}, []string{
		"hello-sockscale-0 [http:8012] [10.0.2.10]",
		"hello-sockscale-1 [metrics:9091] [10.0.1.1]",
		"hello-sockscale-v6-0 [http:8012] [fd00:2::10]",
		"hello-sockscale-v6-1 [metrics:9091] [fd00:1::1]",
	})
	watching = true
	step("serve, the pod ready in IPv4 only", update(f.sks, func() { f.sks.Spec.Mode = v1alpha1.ModeServe }), []string{
		"hello-sockscale-0 [http:8080 metrics:9091] [10.0.1.1]",
		"hello-sockscale-v6-0 [http:8012] [fd00:2::10]",
		"hello-sockscale-v6-1 [http:8080 metrics:9091] [fd00:1::1]",
	})
	step("serve, the pod ready in both", update(v6, func() { v6.Endpoints[0].Conditions.Ready = ptr.To(true) }), []string{
		"hello-sockscale-0 [http:8080 metrics:9091] [10.0.1.1]",
		"hello-sockscale-v6-0 [http:8080 metrics:9091] [fd00:1::1]",
	})
	if len(gaps) > 0 {
		t.Errorf("kube-proxy syncing between writes would refuse connections:\n%s", strings.Join(gaps, "\n"))
	}
}

// endpointsFamily is the address type a slice's name says.
func endpointsFamily(name string) discoveryv1.AddressType {
	if strings.Contains(name, "-sockscale-v6-") {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// TestSliceOfAnotherAddressTypeIsMadeAnew: a slice's address type cannot
// change (the API server refuses it, as the client here does), so a
// slice of sockscale's under a name now wanted for the other family is
// deleted and created again, not updated.
func TestSliceOfAnotherAddressTypeIsMadeAnew(t *testing.T) {
	f := newFixture(v1alpha1.ModeServe, 80, pod("10.0.1.1", true))
	f.extra = append(f.extra, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-sockscale-0", Labels: map[string]string{
			discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ServerlessService", Name: "hello", UID: "sks-uid", Controller: ptr.To(true)}}},
		AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{pod("fd00:9::9", true)}})
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	objs := append(append([]client.Object{f.sks, f.public}, f.private...), f.extra...)
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				var have discoveryv1.EndpointSlice
				if err := c.Get(ctx, client.ObjectKeyFromObject(s), &have); err == nil && have.AddressType != s.AddressType {
					return fmt.Errorf("addressType: field is immutable (%s to %s)", have.AddressType, s.AddressType)
				}
			}
			return c.Update(ctx, obj, opts...)
		}}).Build()
	r := &ServerlessService{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}
	got := publicSlices(t, c)
	if len(got) != 1 || got[0].Name != "hello-sockscale-0" || got[0].AddressType != discoveryv1.AddressTypeIPv4 {
		t.Fatalf("public slices %+v, want hello-sockscale-0 of IPv4", got)
	}
	if diff := cmp.Diff([]summary{{Ports: []string{"http:8080", "metrics:9091"}, Addresses: []string{"10.0.1.1"}}}, summarize(got)); diff != "" {
		t.Errorf("public slices (-want +got):\n%s", diff)
	}
}
