package watch

import (
	"context"
	"net/http"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/readiness"
)

// TestPodCheck: the activator checks a pod the way its serving
// container's readiness probe does when that is an httpGet over HTTP
// (named or numbered port, headers; the probe's host is never used),
// and otherwise by a TCP connection to the serving port; never by a GET
// of the work path.
func TestPodCheck(t *testing.T) {
	httpGet := func(path string, port intstr.IntOrString) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: port}}}
	}
	app := func(probe *corev1.Probe, ports ...corev1.ContainerPort) corev1.Container {
		return corev1.Container{Name: "app", Ports: ports, ReadinessProbe: probe}
	}
	http8080 := corev1.ContainerPort{Name: "http", ContainerPort: 8080}
	tcp := &readiness.Check{Port: 8080}
	for _, tt := range []struct {
		name       string
		containers []corev1.Container
		want       *readiness.Check
	}{
		{"named port", []corev1.Container{app(httpGet("/healthz", intstr.FromString("http")), http8080)},
			&readiness.Check{HTTP: true, Port: 8080, Path: "/healthz"}},
		{"numbered port, path without a slash", []corev1.Container{app(httpGet("ready", intstr.FromInt32(9000)), http8080)},
			&readiness.Check{HTTP: true, Port: 9000, Path: "/ready"}},
		{"headers kept, host ignored", []corev1.Container{app(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromInt32(8080), Host: "10.0.0.1", HTTPHeaders: []corev1.HTTPHeader{{Name: "Host", Value: "hello.local"}}}}}, http8080)},
			&readiness.Check{HTTP: true, Port: 8080, Path: "/healthz", Header: http.Header{"Host": {"hello.local"}}}},
		{"the container serving the port, not the first", []corev1.Container{
			{Name: "sidecar", Ports: []corev1.ContainerPort{{ContainerPort: 15000}}, ReadinessProbe: httpGet("/sidecar", intstr.FromInt32(15000))},
			app(httpGet("/healthz", intstr.FromInt32(8080)), http8080)},
			&readiness.Check{HTTP: true, Port: 8080, Path: "/healthz"}},
		{"only container, ports not declared", []corev1.Container{app(httpGet("/healthz", intstr.FromInt32(8080)))},
			&readiness.Check{HTTP: true, Port: 8080, Path: "/healthz"}},
		{"HTTPS probe", []corev1.Container{app(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromInt32(8443), Scheme: corev1.URISchemeHTTPS}}}, http8080)}, tcp},
		{"unknown port name", []corev1.Container{app(httpGet("/healthz", intstr.FromString("admin")), http8080)}, tcp},
		{"TCP probe", []corev1.Container{app(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}}, http8080)}, tcp},
		{"no probe", []corev1.Container{app(nil, http8080)}, tcp},
		{"two containers, neither declaring the port", []corev1.Container{app(httpGet("/a", intstr.FromInt32(8080))), {Name: "b", ReadinessProbe: httpGet("/b", intstr.FromInt32(8080))}}, tcp},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := podCheck(&corev1.Pod{Spec: corev1.PodSpec{Containers: tt.containers}}, 8080)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("check (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncGivesPodsTheirChecks: Sync passes each pod's own readiness
// check to the prober (the pod read from the cache by the endpoint's
// targetRef); a pod the cache does not have yet gets none (the prober's
// default).
func TestSyncGivesPodsTheirChecks(t *testing.T) {
	probed := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "hello-a"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}},
	}}}}
	objs := []client.Object{
		pa("hello", "hello", 100),
		service("hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}),
		sks("hello", "hello", "activator-a"),
		private("hello", "hello"),
		slice("hello-private-1", "hello-private", map[string]int32{"http": 8080},
			ep{ip: "10.244.1.7", pod: "hello-a"}, ep{ip: "10.244.1.8", pod: "hello-b"}),
		probed,
	}
	s := newSinks()
	if err := watcher(s).Sync(context.Background(), reader(t, objs...), hello); err != nil {
		t.Fatal(err)
	}
	want := []readiness.Pod{
		{Addr: netip.MustParseAddrPort("10.244.1.7:8080"), Check: &readiness.Check{HTTP: true, Port: 8080, Path: "/healthz"}},
		{Addr: netip.MustParseAddrPort("10.244.1.8:8080")},
	}
	if diff := cmp.Diff(want, s.pods[hello], cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
}
