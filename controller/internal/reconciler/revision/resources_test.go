package revision

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// revision builds a Revision of the Service hello with one container.
type revision struct{ r *servingv1alpha1.Revision }

func rev(name string) *revision {
	return &revision{&servingv1alpha1.Revision{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{servingv1alpha1.ServiceLabelKey: "hello"}},
		Spec:       servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: "hello:v1"}}},
	}}
}

func (b *revision) Annotation(k, v string) *revision {
	if b.r.Annotations == nil {
		b.r.Annotations = map[string]string{}
	}
	b.r.Annotations[k] = v
	return b
}

func (b *revision) Port(name string, port int32) *revision {
	b.r.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: name, ContainerPort: port}}
	return b
}

func (b *revision) Concurrency(cc, timeout int64) *revision {
	b.r.Spec.ContainerConcurrency, b.r.Spec.TimeoutSeconds = &cc, &timeout
	return b
}

func (b *revision) Obj() *servingv1alpha1.Revision { return b.r }

func TestMakeDeploymentDefaults(t *testing.T) {
	d := MakeDeployment(rev("hello-00001").Annotation("autoscaling.knative.dev/min-scale", "1").
		Annotation("autoscaling.knative.dev/class", "kpa.autoscaling.knative.dev").
		Annotation("serving.sockscale.dev/template-hash", "abc").Obj(), 0)
	labels := map[string]string{servingv1alpha1.ServiceLabelKey: "hello", servingv1alpha1.RevisionLabelKey: "hello-00001"}
	want := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001-deployment", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{servingv1alpha1.RevisionLabelKey: "hello-00001"}},
			ProgressDeadlineSeconds: ptr.To(int32(600)),
			Template: corev1.PodTemplateSpec{
				// min-scale is read there by the PodAutoscaler; the class
				// and sockscale's own annotations are not copied.
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"autoscaling.knative.dev/min-scale": "1"}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(300)),
					Containers: []corev1.Container{{
						Name:  "user-container",
						Image: "hello:v1",
						Ports: []corev1.ContainerPort{{Name: "user-port", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
						Env: []corev1.EnvVar{{Name: "PORT", Value: "8080"}, {Name: "K_REVISION", Value: "hello-00001"},
							{Name: "K_CONFIGURATION", Value: "hello"}, {Name: "K_SERVICE", Value: "hello"}},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						// Knative's default readiness: a connect to the port,
						// as often as the kubelet can.
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
							TimeoutSeconds: 1, PeriodSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3},
					}},
				},
			},
		},
	}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("Deployment (-want +got):\n%s", diff)
	}
}

func TestMakeDeploymentProbesAndContainers(t *testing.T) {
	r := rev("hello-00002").Port("", 9000).Obj()
	r.Spec.TimeoutSeconds = ptr.To(int64(30))
	r.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "PORT", Value: "9999"}}
	r.Spec.Containers[0].ReadinessProbe = &servingv1alpha1.Probe{ProbeHandler: servingv1alpha1.ProbeHandler{HTTPGet: &servingv1alpha1.HTTPGetAction{Path: "/ready"}}, PeriodSeconds: 5}
	r.Spec.Containers[0].LivenessProbe = &servingv1alpha1.Probe{ProbeHandler: servingv1alpha1.ProbeHandler{GRPC: &servingv1alpha1.GRPCAction{}}}
	r.Spec.Containers = append(r.Spec.Containers, servingv1alpha1.Container{Image: "sidecar",
		LivenessProbe: &servingv1alpha1.Probe{ProbeHandler: servingv1alpha1.ProbeHandler{TCPSocket: &servingv1alpha1.TCPSocketAction{Port: ptr.To(intstr.FromInt32(7000))}}}})
	d := MakeDeployment(r, 0)
	pod := d.Spec.Template.Spec
	if got := *pod.TerminationGracePeriodSeconds; got != 30 {
		t.Errorf("terminationGracePeriodSeconds %d, want the timeout 30", got)
	}
	if len(pod.Containers) != 2 || pod.Containers[0].Name != "user-container-0" || pod.Containers[1].Name != "user-container-1" {
		t.Fatalf("containers %+v, want user-container-0 and -1", pod.Containers)
	}
	serving, side := pod.Containers[0], pod.Containers[1]
	if diff := cmp.Diff([]corev1.ContainerPort{{Name: "user-port", ContainerPort: 9000, Protocol: corev1.ProtocolTCP}}, serving.Ports); diff != "" {
		t.Errorf("serving ports (-want +got):\n%s", diff)
	}
	wantEnv := []corev1.EnvVar{{Name: "PORT", Value: "9999"}, {Name: "K_REVISION", Value: "hello-00002"}, {Name: "K_CONFIGURATION", Value: "hello"}, {Name: "K_SERVICE", Value: "hello"}}
	if diff := cmp.Diff(wantEnv, serving.Env); diff != "" {
		t.Errorf("env: the user's PORT stands (-want +got):\n%s", diff)
	}
	wantReady := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(9000)}},
		TimeoutSeconds: 1, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 3}
	if diff := cmp.Diff(wantReady, serving.ReadinessProbe); diff != "" {
		t.Errorf("readiness probe (-want +got):\n%s", diff)
	}
	wantLive := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 9000}},
		TimeoutSeconds: 1, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3}
	if diff := cmp.Diff(wantLive, serving.LivenessProbe); diff != "" {
		t.Errorf("liveness probe (-want +got):\n%s", diff)
	}
	if side.Ports != nil || side.Env != nil || side.ReadinessProbe != nil {
		t.Errorf("the second container got serving settings: %+v", side)
	}
	if got := side.LivenessProbe.TCPSocket.Port; got != intstr.FromInt32(7000) {
		t.Errorf("sidecar probe port %v, want its own 7000", got)
	}
}

func TestMakePublicService(t *testing.T) {
	tests := []struct {
		name string
		rev  *servingv1alpha1.Revision
		want corev1.ServicePort
	}{
		{"default port", rev("hello-00001").Obj(), corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		{"declared port", rev("hello-00001").Port("http1", 9000).Obj(), corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(9000)}},
		{"h2c", rev("hello-00001").Port("h2c", 9000).Obj(), corev1.ServicePort{Name: "http2", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(9000), AppProtocol: ptr.To("kubernetes.io/h2c")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001",
					Labels: map[string]string{servingv1alpha1.ServiceLabelKey: "hello", servingv1alpha1.RevisionLabelKey: "hello-00001"}},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{tt.want},
					IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack)},
			}
			if diff := cmp.Diff(want, MakePublicService(tt.rev)); diff != "" {
				t.Errorf("Service (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMakePodAutoscaler(t *testing.T) {
	base := v1alpha1.PodAutoscalerSpec{
		ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello-00001-deployment"},
		Service:        v1alpha1.ServiceRef{Name: "hello-00001", Port: 80},
	}
	with := func(f func(*v1alpha1.PodAutoscalerSpec)) v1alpha1.PodAutoscalerSpec {
		s := base
		f(&s)
		return s
	}
	tests := []struct {
		name string
		rev  *servingv1alpha1.Revision
		want v1alpha1.PodAutoscalerSpec
	}{
		{"defaults", rev("hello-00001").Obj(), base},
		{"containerConcurrency and timeoutSeconds", rev("hello-00001").Concurrency(10, 60).Obj(), with(func(s *v1alpha1.PodAutoscalerSpec) {
			s.ContainerConcurrency, s.TimeoutSeconds = 10, ptr.To(int32(60))
		})},
		// The autoscaling keys stay annotations, read from the pod
		// template (config.ForPodAutoscaler): an unset spec.metric leaves
		// the metric to them.
		{"metric annotation", rev("hello-00001").Annotation("autoscaling.knative.dev/metric", "rps").Obj(), base},
		{"target annotation", rev("hello-00001").Annotation("autoscaling.knative.dev/target", "7").Obj(), base},
		// The class goes to the spec instead (it is not copied to the
		// pods: see annotationsNotCopied).
		{"HPA class", rev("hello-00001").Annotation("autoscaling.knative.dev/class", "hpa.autoscaling.knative.dev").Obj(), with(func(s *v1alpha1.PodAutoscalerSpec) {
			s.Class = v1alpha1.ClassHPA
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pa := MakePodAutoscaler(tt.rev)
			if diff := cmp.Diff(tt.want, pa.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if pa.Name != "hello-00001" || pa.Labels[servingv1alpha1.RevisionLabelKey] != "hello-00001" || pa.Labels[servingv1alpha1.ServiceLabelKey] != "hello" {
				t.Errorf("name %q labels %v", pa.Name, pa.Labels)
			}
		})
	}
}

// TestDeploymentInSync: the API server's defaults and the autoscaler's
// replicas are not drift; a changed image or an added container is.
func TestDeploymentInSync(t *testing.T) {
	want := MakeDeployment(rev("hello-00001").Obj(), 0)
	live := want.DeepCopy()
	live.Spec.Replicas = ptr.To(int32(5))
	live.Spec.RevisionHistoryLimit = ptr.To(int32(10))
	live.Spec.Template.Spec.DNSPolicy = corev1.DNSClusterFirst
	live.Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	live.Spec.Template.Spec.Containers[0].ReadinessProbe.TCPSocket.Host = ""
	live.Labels["extra"] = "kept"
	if !deploymentInSync(live, want) {
		t.Error("defaults and replicas counted as drift")
	}
	image := live.DeepCopy()
	image.Spec.Template.Spec.Containers[0].Image = "other"
	added := live.DeepCopy()
	added.Spec.Template.Spec.Containers = append(added.Spec.Template.Spec.Containers, corev1.Container{Name: "x", Image: "x"})
	label := live.DeepCopy()
	delete(label.Labels, servingv1alpha1.RevisionLabelKey)
	for name, d := range map[string]*appsv1.Deployment{"image": image, "added container": added, "label": label} {
		if deploymentInSync(d, want) {
			t.Errorf("%s: drift not seen", name)
		}
		correctDeployment(d, want)
		if !deploymentInSync(d, want) || *d.Spec.Replicas != 5 {
			t.Errorf("%s: corrected Deployment still drifted, or lost its replicas (%d)", name, *d.Spec.Replicas)
		}
	}
}

// TestDrainHook: with the agents' drain port, every container waits for
// the node's agent before it is stopped, naming the pod's workload (its
// Deployment); the API server's defaults are no drift.
func TestDrainHook(t *testing.T) {
	r := rev("hello-00001").Obj()
	r.Namespace = "shop"
	r.Spec.Containers = append(r.Spec.Containers, servingv1alpha1.Container{Name: "cache", Image: "cache"})
	d := MakeDeployment(r, 9094)
	want := &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
		Host: "127.0.0.1", Port: intstr.FromInt32(9094), Path: "/drain?namespace=shop&workload=hello-00001-deployment", Scheme: corev1.URISchemeHTTP,
	}}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Lifecycle == nil {
			t.Fatalf("container %s has no preStop hook", c.Name)
		}
		if diff := cmp.Diff(want, c.Lifecycle.PreStop); diff != "" {
			t.Errorf("container %s preStop (-want +got):\n%s", c.Name, diff)
		}
	}
	if !deploymentInSync(d.DeepCopy(), d) {
		t.Error("a Deployment with the hook is not in sync with itself")
	}
	if c := MakeDeployment(r, 0).Spec.Template.Spec.Containers[0]; c.Lifecycle != nil {
		t.Errorf("without a drain port: lifecycle %+v, want none", c.Lifecycle)
	}
}
