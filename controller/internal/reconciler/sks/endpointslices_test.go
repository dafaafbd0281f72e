package sks

import (
	"context"
	"sort"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
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
				{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)},
				{Name: ptr("metrics"), Port: ptr(int32(9091)), Protocol: ptr(corev1.ProtocolTCP)},
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
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}
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
			sum.Ports = append(sum.Ports, ptrValue(p.Name)+":"+strconv.Itoa(int(ptrValue(p.Port))))
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
