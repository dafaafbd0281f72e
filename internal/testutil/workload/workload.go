package workload

import (
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Deployment is a Deployment as users write them: three containers with
// ten env vars each, a port each, probes, resources and a config mount, applied with
// kubectl (so its last-applied-configuration annotation repeats the
// object), with managed fields and a status; its pod template asks for
// min-scale 1 and target 20 in Knative's annotations.
func Deployment(namespace, name string) *appsv1.Deployment {
	var containers []corev1.Container
	for c := range 3 {
		ctr := corev1.Container{
			Name: fmt.Sprintf("c%d", c), Image: fmt.Sprintf("registry.example/team/%s-%d:v1.2.3@sha256:%064d", name, c, c),
			Args:  []string{fmt.Sprintf("--listen=:%d", 8080+c), "--log-level=info", "--config=/etc/app/config.yaml"},
			Ports: []corev1.ContainerPort{{Name: fmt.Sprintf("http-%d", c), ContainerPort: int32(8080 + c)}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(int32(8080 + c))}}, PeriodSeconds: 5},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/livez", Port: intstr.FromInt32(int32(8080 + c))}}, PeriodSeconds: 10},
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
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: "7f0c8a52-7d7e-4a55-9d55-0c4a52f0a1b2", ResourceVersion: "123456", Generation: 4,
			Labels: labels,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1",
				FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:replicas":{},"f:template":{"f:spec":{"f:containers":{}}}}}`)}},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas:                ptr.To[int32](3),
			Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			ProgressDeadlineSeconds: ptr.To[int32](600),
			RevisionHistoryLimit:    ptr.To[int32](10),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/target": "20"}},
				Spec: corev1.PodSpec{Containers: containers, ServiceAccountName: name,
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name + "-config"}}}}}},
			},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, ReadyReplicas: 3, AvailableReplicas: 3, UpdatedReplicas: 3,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}}},
	}
	applied, err := json.Marshal(d)
	if err != nil {
		panic(err) // a Deployment always marshals
	}
	d.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied), "deployment.kubernetes.io/revision": "4"}
	return d
}

// EndpointSlice is the EndpointSlice of Service service with n pods (at
// most 65,536), as Kubernetes' EndpointSlice controller writes it.
func EndpointSlice(namespace, service string, n int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service + "-x7k2p", UID: "0b5d2c1e-3f4a-4b6c-8d7e-9f0a1b2c3d4e", ResourceVersion: "98765",
			Labels:      map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": service},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-26T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: service, UID: "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
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
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: fmt.Sprintf("%s-5d8f7c9b4-%05d", service, i), UID: "2b3c4d5e-6f7a-4b9c-8d0e-1f2a3b4c5d6e"},
		})
	}
	return s
}
