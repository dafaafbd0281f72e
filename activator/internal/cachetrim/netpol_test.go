package cachetrim

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/activator/internal/netpol"
	"github.com/sockscale/sockscale/activator/internal/target"
)

// userPod is a Deployment's pod as the API holds it: owners, volumes,
// env, probes, resources, a sidecar with a port, conditions and
// container statuses.
func userPod(namespace, name, ip string, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("pod-" + name), ResourceVersion: "98765",
			CreationTimestamp: metav1.Unix(1795000000, 0), GenerateName: name[:len(name)-5], Labels: labels,
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z", "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name[:len(name)-6],
				UID: "rs-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: managed("kube-controller-manager", `{"f:metadata":{"f:labels":{}},"f:spec":{"f:containers":{}}}`)},
		Spec: corev1.PodSpec{
			NodeName: "node-7", ServiceAccountName: "default", RestartPolicy: corev1.RestartPolicyAlways,
			Volumes: []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}}}}}},
			InitContainers: []corev1.Container{
				{Name: "migrate", Image: "shop/migrate:1.2"},
				{Name: "envoy", Image: "envoy:1.30", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
					Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 15000, Protocol: corev1.ProtocolTCP}}},
			},
			Containers: []corev1.Container{{
				Name: "app", Image: "shop/hello:2.0", Args: []string{"--listen=:8080"},
				Env:   []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "debug"}, {Name: "DB_URL", Value: "postgres://db.shop:5432/shop"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"),
					corev1.ResourceMemory: resource.MustParse("128Mi")}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
				VolumeMounts:   []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
			}, {Name: "logger", Image: "fluent-bit:3"}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "172.18.0.7", PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			StartTime: ptr.To(metav1.Unix(1795000001, 0)), QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "shop/hello:2.0", ImageID: "sha256:0123456789abcdef",
				ContainerID: "containerd://0123456789abcdef"}},
		},
	}
	return p
}

// TestPodKeepsWhatNetpolReads: a pod keeps its key, labels, host network,
// ports and HTTP readiness probes (of every container and init container
// that has some; the probe without its host), phase and addresses, and
// loses the rest.
func TestPodKeepsWhatNetpolReads(t *testing.T) {
	in := userPod("shop", "hello-7d9f8-abcde", "10.244.1.7", map[string]string{"app": "hello", "pod-template-hash": "7d9f8"})
	in.Spec.HostNetwork = true
	in.Spec.Containers[0].ReadinessProbe.HTTPGet.Host = "10.0.0.1"
	in.Spec.Containers[0].ReadinessProbe.PeriodSeconds = 3
	in.Spec.Containers[1].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path: "/up", Port: intstr.FromInt32(2020), HTTPHeaders: []corev1.HTTPHeader{{Name: "Host", Value: "logger.local"}}}}}
	out, err := Pod(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Pod{
		TypeMeta: in.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "hello-7d9f8-abcde", UID: in.UID, ResourceVersion: in.ResourceVersion,
			Labels: map[string]string{"app": "hello", "pod-template-hash": "7d9f8"}},
		Spec: corev1.PodSpec{HostNetwork: true,
			InitContainers: []corev1.Container{{Name: "envoy", Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 15000, Protocol: corev1.ProtocolTCP}}}},
			Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}}},
				{Name: "logger", ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/up", Port: intstr.FromInt32(2020), HTTPHeaders: []corev1.HTTPHeader{{Name: "Host", Value: "logger.local"}}}}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}}},
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("trimmed Pod (-want +got):\n%s", diff)
	}
}

// TestNamespaceAndPolicyKeepWhatNetpolReads: a namespace keeps its
// metadata but annotations and managed fields; a policy its spec too.
func TestNamespaceAndPolicyKeepWhatNetpolReads(t *testing.T) {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{corev1.LabelMetadataName: "shop", "tier": "web"},
		Annotations: map[string]string{"owner": "checkout"}, ManagedFields: managed("kubectl", `{"f:metadata":{}}`)},
		Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
	out, err := Namespace(n.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	wantNs := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: n.Labels}}
	if diff := cmp.Diff(wantNs, out); diff != "" {
		t.Errorf("trimmed Namespace (-want +got):\n%s", diff)
	}
	p := shopPolicy()
	lastApplied(p, p.Spec)
	out, err = NetworkPolicy(p.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	wantPol := shopPolicy()
	wantPol.ManagedFields = nil
	if diff := cmp.Diff(wantPol, out); diff != "" {
		t.Errorf("trimmed NetworkPolicy (-want +got):\n%s", diff)
	}
}

// shopPolicy admits to app=hello's named port http the pods labelled
// role=frontend of namespaces labelled tier=web.
func shopPolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "hello",
		ManagedFields: managed("kubectl", `{"f:spec":{}}`)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hello"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "frontend"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}},
			}}}}
}

// TestTrimmedObjectsYieldTheSameDecisions: the Admitter decides the same
// from trimmed pods, namespaces and policies as from whole ones.
func TestTrimmedObjectsYieldTheSameDecisions(t *testing.T) {
	web := map[string]string{corev1.LabelMetadataName: "front", "tier": "web"}
	objs := []client.Object{
		shopPolicy(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{corev1.LabelMetadataName: "shop"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "front", Labels: web}},
		userPod("shop", "hello-7d9f8-abcde", "10.244.1.7", map[string]string{"app": "hello"}),
		userPod("front", "web-5c6d7-fghij", "10.244.2.1", map[string]string{"role": "frontend"}),
		userPod("front", "job-5c6d7-klmno", "10.244.2.2", map[string]string{"role": "batch"}),
	}
	decide := func(objs []client.Object) map[string]string {
		b := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithIndex(&corev1.Pod{}, netpol.PodIPField, netpol.PodIPs)
		a := netpol.New(netpol.Options{Reader: b.Build(), Synced: func() bool { return true }})
		got := map[string]string{}
		for _, c := range []string{"10.244.2.1", "10.244.2.2", "192.168.1.1"} {
			for _, dest := range []string{"10.244.1.7:8080", "10.244.1.7:9090"} {
				err := a.Admit(context.Background(), netip.MustParseAddr(c), target.Key{Namespace: "shop", Name: "hello"}, netip.MustParseAddrPort(dest))
				got[c+"->"+dest] = "admitted"
				if err != nil {
					got[c+"->"+dest] = err.Error()
				}
			}
		}
		return got
	}
	whole, trimmed := decide(objs), decide(trim(t, objs))
	if whole["10.244.2.1->10.244.1.7:8080"] != "admitted" || whole["10.244.2.2->10.244.1.7:8080"] == "admitted" {
		t.Fatalf("the scenario does not exercise the policy: %v", whole)
	}
	if diff := cmp.Diff(whole, trimmed); diff != "" {
		t.Errorf("decisions on trimmed objects (-whole +trimmed):\n%s", diff)
	}
}
