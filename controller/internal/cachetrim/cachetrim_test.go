package cachetrim

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
)

// userDeployment is a Deployment as users write them: three containers
// with env, probes, resources and mounts, applied with kubectl (so its
// last-applied-configuration annotation repeats the object), with
// managed fields and a status.
func userDeployment(name string) *appsv1.Deployment {
	var containers []corev1.Container
	for c := range 3 {
		ctr := corev1.Container{
			Name: fmt.Sprintf("c%d", c), Image: fmt.Sprintf("registry.example/team/%s-%d:v1.2.3@sha256:%064d", name, c, c),
			Args:  []string{"--listen=:8080", "--log-level=info", "--config=/etc/app/config.yaml"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 5},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/livez", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 10},
			VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
		}
		for e := range 10 {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%d", e), Value: fmt.Sprintf("value-of-setting-%d", e)})
		}
		containers = append(containers, ctr)
	}
	labels := map[string]string{"app": name, "app.kubernetes.io/part-of": "shop"}
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: "7f0c8a52-7d7e-4a55-9d55-0c4a52f0a1b2", ResourceVersion: "123456", Generation: 4,
			Labels:        labels,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:replicas":{},"f:template":{"f:spec":{"f:containers":{}}}}}`)}},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas:                ptr.To[int32](3),
			Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			ProgressDeadlineSeconds: ptr.To[int32](600),
			RevisionHistoryLimit:    ptr.To[int32](10),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{config.AnnotationPrefix + "min-scale": "1", config.AnnotationPrefix + "target": "20"}},
				Spec: corev1.PodSpec{Containers: containers, ServiceAccountName: name,
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name + "-config"}}}}}},
			},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, ReadyReplicas: 3, AvailableReplicas: 3, UpdatedReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}}},
	}
	applied, err := json.Marshal(d)
	if err != nil {
		panic(err)
	}
	d.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied), "deployment.kubernetes.io/revision": "4"}
	return d
}

// userSlice is an EndpointSlice of a Service with n pods, as Kubernetes'
// EndpointSlice controller writes it.
func userSlice(name string, n int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name + "-x7k2p", UID: "0b5d2c1e-3f4a-4b6c-8d7e-9f0a1b2c3d4e", ResourceVersion: "98765",
			Labels:      map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": name},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-26T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i := range n {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%04d", i)),
			Zone:       ptr.To("zone-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: fmt.Sprintf("%s-5d8f7c9b4-%05d", name, i), UID: "2b3c4d5e-6f7a-4b9c-8d0e-1f2a3b4c5d6e"},
		})
	}
	return s
}

func revisionControlled(d *appsv1.Deployment, apiVersion string, controller bool) *appsv1.Deployment {
	d.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: "Revision", Name: "hello-00001", UID: "3c4d5e6f-7a8b-4c0d-9e1f-2a3b4c5d6e7f", Controller: ptr.To(controller)}}
	return d
}

// TestDeploymentKeepsWhatTheControllerReads: a Deployment sockscale does
// not control loses its pod template's spec and its annotations, and keeps
// what the reconcilers read: the settings it yields are the same.
func TestDeploymentKeepsWhatTheControllerReads(t *testing.T) {
	full := userDeployment("cart")
	out, err := Deployment(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*appsv1.Deployment)
	want := full.DeepCopy()
	want.ManagedFields, want.Annotations = nil, nil
	want.Spec.RevisionHistoryLimit = nil
	want.Spec.Template.Spec = corev1.PodSpec{}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimmed Deployment (-want +got):\n%s", diff)
	}
	pa := &v1alpha1.PodAutoscaler{Spec: v1alpha1.PodAutoscalerSpec{MaxScale: ptr.To[int32](9)}}
	fromFull, errFull := config.ForPodAutoscaler(config.Defaults(), pa, full)
	fromTrimmed, errTrimmed := config.ForPodAutoscaler(config.Defaults(), pa, got)
	if errFull != nil || errTrimmed != nil {
		t.Fatalf("settings: %v, %v", errFull, errTrimmed)
	}
	if diff := cmp.Diff(fromFull, fromTrimmed); diff != "" {
		t.Errorf("settings of the trimmed Deployment differ (-full +trimmed):\n%s", diff)
	}
}

// TestARevisionsDeploymentIsKeptWhole: the Revision reconciler compares
// and corrects the pod template of the Deployments it controls, so those
// keep it; an owner that is not the controller, or a Revision of another
// API group, does not count.
func TestARevisionsDeploymentIsKeptWhole(t *testing.T) {
	for _, tt := range []struct {
		name       string
		apiVersion string
		controller bool
		whole      bool
	}{
		{"controlled by a Revision", "serving.sockscale.dev/v1alpha1", true, true},
		{"controlled by a later version's Revision", "serving.sockscale.dev/v1", true, true},
		{"owned by a Revision, not controlled", "serving.sockscale.dev/v1alpha1", false, false},
		{"controlled by another group's Revision", "serving.knative.dev/v1", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := revisionControlled(userDeployment("cart"), tt.apiVersion, tt.controller)
			out, err := Deployment(d.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			got := out.(*appsv1.Deployment)
			if len(got.ManagedFields) != 0 {
				t.Error("managed fields kept")
			}
			if whole := len(got.Spec.Template.Spec.Containers) == 3 && got.Annotations != nil; whole != tt.whole {
				t.Errorf("kept whole: %v, want %v", whole, tt.whole)
			}
		})
	}
}

// TestEndpointSlicesSockscaleReadsAreKeptWhole: the slices sockscale
// writes and those of private Services keep their endpoints; any other
// keeps what the ServerlessService reconciler reads of a foreign slice on
// a public Service (name, labels, owner) and loses its endpoints.
func TestEndpointSlicesSockscaleReadsAreKeptWhole(t *testing.T) {
	for _, tt := range []struct {
		name   string
		labels map[string]string
		whole  bool
	}{
		{"written by sockscale", map[string]string{discoveryv1.LabelManagedBy: sks.ManagedBy}, true},
		{"of a private Service", map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", sks.LabelServerlessService: "hello"}, true},
		{"of any other Service", map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}, false},
		{"mirrored from an Endpoints object", map[string]string{discoveryv1.LabelManagedBy: "endpointslicemirroring-controller.k8s.io"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := userSlice("hello", 5)
			s.Labels = tt.labels
			s.Labels[discoveryv1.LabelServiceName] = "hello"
			out, err := EndpointSlice(s.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			want := s.DeepCopy()
			if !tt.whole {
				want.Endpoints, want.Annotations = nil, nil
			}
			if diff := cmp.Diff(want, out); diff != "" {
				t.Errorf("cached slice (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOtherObjectsPassThrough: what the informer hands over that is not
// the type a transform is for (a tombstone) comes out as it went in.
func TestOtherObjectsPassThrough(t *testing.T) {
	tomb := toolscache.DeletedFinalStateUnknown{Key: "shop/cart", Obj: userDeployment("cart")}
	for name, transform := range map[string]toolscache.TransformFunc{"Deployment": Deployment, "EndpointSlice": EndpointSlice} {
		out, err := transform(tomb)
		if err != nil || !cmp.Equal(out, tomb) {
			t.Errorf("%s transform of a tombstone: %v, %v", name, out, err)
		}
	}
}
