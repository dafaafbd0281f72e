package chart_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// vapAPI makes `helm template` render what needs the API server to serve
// ValidatingAdmissionPolicy (helm install asks the cluster).
var vapAPI = []string{"--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}

// controllerSA is the user name of the controller's ServiceAccount in a
// default install.
const controllerSA = "system:serviceaccount:" + namespace + ":" + controllerName

// TestIntegrationControllerAdmissionPolicy: the chart's admission
// policies, on a real kube-apiserver, refuse what a compromised
// controller would write (a privileged, host-network, hostPath or
// SYS_ADMIN Deployment, a Deployment no Revision controls, a Service with
// externalIPs, a slice not its own) and pass what the controller writes
// for a Revision; a hostPath passes once the autoscaler ConfigMap's
// podspec-volumes-hostpath is enabled; other users are not checked.
func TestIntegrationControllerAdmissionPolicy(t *testing.T) {
	objs := render(t, append(vapAPI, "--show-only", "templates/controller-admissionpolicy.yaml", "--show-only", "templates/autoscaler-configmap.yaml")...)
	cl := testenv.ControlPlane(t)
	admin, ctx := cl.Client, context.Background()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(o.raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("create %s %s: %v", o.Kind, o.Name, err)
		}
	}
	asController, err := client.New(cl.ConfigAs(t, controllerSA, testenv.GeneratedRules(t, "role.yaml")), client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// revisionOwner is a fresh slice each time: cases change theirs.
	revisionOwner := func() []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "serving.sockscale.dev/v1alpha1", Kind: "Revision", Name: "hello-00001",
			UID: "a1b2c3", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	}
	deployment := func(mutate func(*appsv1.Deployment)) *appsv1.Deployment {
		labels := map[string]string{"serving.sockscale.dev/revision": "hello-00001"}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "hello-00001-deployment-", OwnerReferences: revisionOwner(), Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "user-container", Image: "hello:v1",
						Ports: []corev1.ContainerPort{{Name: "user-port", ContainerPort: 8080}}}}},
				},
			},
		}
		mutate(d)
		return d
	}
	privileged := deployment(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	})
	// The policy takes effect once the API server has compiled it.
	testenv.Eventually(t, 30*time.Second, "the policy refuses the controller a privileged Deployment", func() (bool, string) {
		err := asController.Create(ctx, privileged.DeepCopy())
		return err != nil && strings.Contains(err.Error(), "privileged container"), errString(err)
	})

	hostPath := deployment(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "etc", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}}
	})
	for _, tt := range []struct {
		name string
		obj  client.Object
		want string // "" accepted
	}{
		{"a Revision's Deployment", deployment(func(*appsv1.Deployment) {}), ""},
		{"privileged init container", deployment(func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
		}), "privileged container"},
		{"hostNetwork", deployment(func(d *appsv1.Deployment) { d.Spec.Template.Spec.HostNetwork = true }), "hostNetwork, hostPID or hostIPC"},
		{"hostPID", deployment(func(d *appsv1.Deployment) { d.Spec.Template.Spec.HostPID = true }), "hostNetwork, hostPID or hostIPC"},
		{"hostPath while the key is disabled", hostPath.DeepCopy(), "hostPath volume while the autoscaler ConfigMap's podspec-volumes-hostpath is not enabled"},
		{"SYS_ADMIN while the key is disabled", deployment(func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "SYS_ADMIN"}}}
		}), "add capabilities other than NET_BIND_SERVICE while the autoscaler ConfigMap's containerspec-addcapabilities is not enabled"},
		{"NET_BIND_SERVICE", deployment(func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}}}
		}), ""},
		{"no owner", deployment(func(d *appsv1.Deployment) { d.OwnerReferences = nil }), "only Deployments controlled by a serving.sockscale.dev Revision"},
		{"owned, not controlled, by a Revision", deployment(func(d *appsv1.Deployment) { d.OwnerReferences[0].Controller = nil }),
			"only Deployments controlled by a serving.sockscale.dev Revision"},
		{"in another namespace, e.g. kube-system", deployment(func(d *appsv1.Deployment) {
			d.Namespace = "kube-system"
			d.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}), "privileged container"},
		{"a Revision's public Service", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001", OwnerReferences: revisionOwner()},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, ""},
		{"a Service with externalIPs", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capture", OwnerReferences: revisionOwner()},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, ExternalIPs: []string{"8.8.8.8"}}}, "may not set a Service's externalIPs"},
		{"a LoadBalancer Service", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "lb", OwnerReferences: revisionOwner()},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, "a type other than ClusterIP"},
		{"a Service of no sockscale object", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "stray"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, "controlled by a Revision, a Route or a ServerlessService"},
		{"a slice of a ServerlessService", slice("hello-00001-sockscale-0", "controller.sockscale.dev", true), ""},
		{"a slice labelled as Kubernetes'", slice("hello-00001-sockscale-1", "endpointslice-controller.k8s.io", true), "managed-by=controller.sockscale.dev"},
		{"a slice of no sockscale object", slice("hello-00001-sockscale-2", "controller.sockscale.dev", false), "controlled by a Revision, a Route or a ServerlessService"},
		{"a PodAutoscaler's HPA", hpa("web", "web"), ""},
		{"an HPA of another name's PodAutoscaler", hpa("kube-dns", "web"), "controlled by the PodAutoscaler of the same name"},
		{"an HPA of no PodAutoscaler", hpa("stray", ""), "controlled by the PodAutoscaler of the same name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := asController.Create(ctx, tt.obj)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}

	t.Run("other users are not checked", func(t *testing.T) {
		if err := admin.Create(ctx, privileged.DeepCopy()); err != nil {
			t.Errorf("an admin's privileged Deployment: %v", err)
		}
	})

	t.Run("hostPath once the ConfigMap enables it", func(t *testing.T) {
		var cm corev1.ConfigMap
		if err := admin.Get(ctx, types.NamespacedName{Namespace: namespace, Name: autoscalerCM}, &cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["podspec-volumes-hostpath"] = "enabled"
		if err := admin.Update(ctx, &cm); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "a hostPath Deployment passes", func() (bool, string) {
			err := asController.Create(ctx, hostPath.DeepCopy())
			return err == nil, errString(err)
		})
	})

	t.Run("the controller's own Deployment: scaled, not changed", func(t *testing.T) {
		own := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: controllerName},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "c"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "c"}},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "controller"}}}}}}
		if err := admin.Create(ctx, own); err != nil {
			t.Fatal(err)
		}
		own.Spec.Replicas = ptr.To(int32(0)) // what the uninstall hook does, by update
		if err := asController.Update(ctx, own); err != nil {
			t.Errorf("scaling its own Deployment to zero: %v", err)
		}
		own.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		if err := asController.Update(ctx, own); err == nil || !strings.Contains(err.Error(), "only Deployments controlled by a serving.sockscale.dev Revision") {
			t.Errorf("changing its own pod template: err = %v, want refused", err)
		}
	})
}

// slice is an EndpointSlice of Service hello-00001 as the controller
// writes it, managed by manager, controlled by a ServerlessService or by
// nothing.
func slice(name, manager string, controlled bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: "hello-00001", discoveryv1.LabelManagedBy: manager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
	if controlled {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "sockscale.dev/v1alpha1", Kind: "ServerlessService", Name: "hello-00001",
			UID: "d4e5f6", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return "accepted"
	}
	return err.Error()
}

// hpa is an HPA named name, controlled by PodAutoscaler owner ("": none).
func hpa(name, owner string) *autoscalingv2.HorizontalPodAutoscaler {
	h := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			MinReplicas:    ptr.To(int32(1)), MaxReplicas: 5,
		},
	}
	if owner != "" {
		h.OwnerReferences = []metav1.OwnerReference{{APIVersion: "sockscale.dev/v1alpha1", Kind: "PodAutoscaler", Name: owner, UID: "d4e5f6", Controller: ptr.To(true)}}
	}
	return h
}
