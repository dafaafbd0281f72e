package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationServingValidation: the generated CRDs accept a Knative
// Service and Route manifest with only the apiVersion changed, and refuse
// each bad object with an error that names the field, on a real
// kube-apiserver.
func TestIntegrationServingValidation(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c := cl.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("Knative Service manifest", func(t *testing.T) {
		// Strict field validation: a field of the manifest that the
		// schema lacks is an error, not silently pruned.
		u := manifest(t, "hello-service.yaml")
		if err := c.Create(ctx, u, &client.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("refused: %v", err)
		}
		var got v1alpha1.Service
		if err := c.Get(ctx, client.ObjectKeyFromObject(u), &got); err != nil {
			t.Fatal(err)
		}
		tmpl := got.Spec.Template
		if a := tmpl.Metadata.Annotations["autoscaling.knative.dev/target"]; a != "10" {
			t.Errorf("template annotation autoscaling.knative.dev/target = %q, want 10 (kept, not pruned)", a)
		}
		if len(tmpl.Spec.Containers) != 1 || len(tmpl.Spec.Containers[0].Env) != 1 || tmpl.Spec.Containers[0].ReadinessProbe == nil {
			t.Errorf("containers = %+v, want the manifest's one container with env and readinessProbe", tmpl.Spec.Containers)
		}
		if diff := cmp.Diff([]string{"hello-00005", "current", "latest"}, []string{got.Spec.Traffic[1].RevisionName, got.Spec.Traffic[1].Tag, got.Spec.Traffic[2].Tag}); diff != "" {
			t.Errorf("traffic (-want +got):\n%s", diff)
		}
	})
	t.Run("Knative Route manifest", func(t *testing.T) {
		if err := c.Create(ctx, manifest(t, "hello-route.yaml"), &client.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("refused: %v", err)
		}
	})

	svc := func(mutate func(*v1alpha1.ServiceSpec)) *v1alpha1.Service {
		var s v1alpha1.Service
		decode(t, "hello-service.yaml", &s)
		s.Name, s.GenerateName = "", "hello-"
		s.Spec.Template.Metadata.Name = ""
		mutate(&s.Spec)
		return &s
	}
	tr := func(percent int64, revision, tag string) v1alpha1.TrafficTarget {
		t := v1alpha1.TrafficTarget{Percent: &percent, RevisionName: revision, Tag: tag}
		if revision == "" {
			t.LatestRevision = ptr.To(true)
		}
		return t
	}
	cases := []struct {
		name   string
		mutate func(*v1alpha1.ServiceSpec)
		want   []string // nil: accepted; else each must appear in the error
	}{
		{"no traffic: all to the latest", func(s *v1alpha1.ServiceSpec) { s.Traffic = nil }, nil},
		{"a target with percent only is the latest (Knative's default)", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{{Percent: ptr.To(int64(100))}}
		}, nil},
		{"percents sum to 99", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(54, "", ""), tr(45, "hello-00005", "")}
		}, []string{"spec.traffic", "the traffic percents must sum to 100"}},
		{"percents sum to 101", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(56, "", ""), tr(45, "hello-00005", "")}
		}, []string{"spec.traffic", "the traffic percents must sum to 100"}},
		{"percent above 100", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(150, "", ""), tr(-50, "hello-00005", "")}
		}, []string{"spec.traffic[0].percent", "less than or equal to 100", "spec.traffic[1].percent", "greater than or equal to 0"}},
		{"revisionName and latestRevision: true", func(s *v1alpha1.ServiceSpec) {
			both := tr(45, "hello-00005", "")
			both.LatestRevision = ptr.To(true)
			s.Traffic = []v1alpha1.TrafficTarget{tr(55, "", ""), both}
		}, []string{"spec.traffic[1]", "sets both revisionName and latestRevision: true"}},
		{"latestRevision: false without revisionName", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{{Percent: ptr.To(int64(100)), LatestRevision: ptr.To(false)}}
		}, []string{"spec.traffic[0]", "has latestRevision: false and no revisionName"}},
		{"configurationName in a Service", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{{Percent: ptr.To(int64(100)), ConfigurationName: "other"}}
		}, []string{"spec.traffic", "configurationName is not allowed in a Service's traffic"}},
		{"duplicate tag", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(55, "", "blue"), tr(45, "hello-00005", "blue")}
		}, []string{"spec.traffic", "tags must be unique: two targets have the same tag"}},
		{"tag not a DNS label", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(100, "", "Blue_1")}
		}, []string{"spec.traffic[0].tag", "should match '^[a-z]([-a-z0-9]*[a-z0-9])?$'"}},
		{"tag longer than 63", func(s *v1alpha1.ServiceSpec) {
			s.Traffic = []v1alpha1.TrafficTarget{tr(100, "", strings.Repeat("a", 64))}
		}, []string{"spec.traffic[0].tag", "may not be more than 63"}},
		{"containerConcurrency 0 (no limit)", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.ContainerConcurrency = ptr.To(int64(0)) }, nil},
		{"containerConcurrency 1000", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.ContainerConcurrency = ptr.To(int64(1000)) }, nil},
		{"negative containerConcurrency", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.ContainerConcurrency = ptr.To(int64(-1)) },
			[]string{"spec.template.spec.containerConcurrency", "greater than or equal to 0"}},
		{"containerConcurrency 1001", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.ContainerConcurrency = ptr.To(int64(1001)) },
			[]string{"spec.template.spec.containerConcurrency", "less than or equal to 1000"}},
		{"timeoutSeconds 0", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.TimeoutSeconds = ptr.To(int64(0)) },
			[]string{"spec.template.spec.timeoutSeconds", "greater than or equal to 1"}},
		{"timeoutSeconds 600", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.TimeoutSeconds = ptr.To(int64(600)) }, nil},
		{"timeoutSeconds 601", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.TimeoutSeconds = ptr.To(int64(601)) },
			[]string{"spec.template.spec.timeoutSeconds", "less than or equal to 600"}},
		{"responseStartTimeoutSeconds above timeoutSeconds", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.TimeoutSeconds, s.Template.Spec.ResponseStartTimeoutSeconds = ptr.To(int64(30)), ptr.To(int64(31))
		}, []string{"spec.template.spec.responseStartTimeoutSeconds", "must not exceed timeoutSeconds"}},
		{"no containers", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.Containers = []v1alpha1.Container{} },
			[]string{"spec.template.spec.containers", "should have at least 1 items"}},
		{"container without image", func(s *v1alpha1.ServiceSpec) { s.Template.Spec.Containers[0].Image = "" },
			[]string{"spec.template.spec.containers[0].image"}},
		{"two ports on the serving container", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers[0].Ports = append(s.Template.Spec.Containers[0].Ports, s.Template.Spec.Containers[0].Ports[0])
		}, []string{"spec.template.spec.containers[0].ports", "must have at most 1 item"}},
		{"a sidecar without ports", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers = append(s.Template.Spec.Containers, v1alpha1.Container{Name: "sidecar", Image: "busybox"})
		}, nil},
		{"two containers with ports", func(s *v1alpha1.ServiceSpec) {
			c := s.Template.Spec.Containers[0]
			c.Name = "second"
			s.Template.Spec.Containers = append(s.Template.Spec.Containers, c)
		}, []string{"spec.template.spec.containers", "exactly one must set ports"}},
		{"autoscaling class neither the KPA nor the HPA", func(s *v1alpha1.ServiceSpec) {
			s.Template.Metadata.Annotations["autoscaling.knative.dev/class"] = "custom.example.com"
		}, []string{"spec.template.metadata.annotations", "autoscaling.knative.dev/class must be kpa.autoscaling.knative.dev, hpa.autoscaling.knative.dev or external.autoscaling.sockscale.dev"}},
		{"the HPA class on cpu", func(s *v1alpha1.ServiceSpec) {
			s.Template.Metadata.Annotations["autoscaling.knative.dev/class"] = "hpa.autoscaling.knative.dev"
			s.Template.Metadata.Annotations["autoscaling.knative.dev/metric"] = "cpu"
		}, nil},
		{"min-scale not an integer", func(s *v1alpha1.ServiceSpec) {
			s.Template.Metadata.Annotations["autoscaling.knative.dev/min-scale"] = "-1"
		}, []string{"spec.template.metadata.annotations", "min-scale, max-scale and initial-scale must be non-negative integers"}},
		{"metric cpu with the KPA", func(s *v1alpha1.ServiceSpec) {
			s.Template.Metadata.Annotations["autoscaling.knative.dev/metric"] = "cpu"
		}, []string{"spec.template.metadata.annotations", "metric must be concurrency or rps, or cpu or memory with autoscaling.knative.dev/class hpa.autoscaling.knative.dev"}},
		// Pod-spec fields no setting allows: refused at once. The
		// fields a setting allows pass here; the controller checks them.
		{"privileged container", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}, []string{"spec.template.spec.containers[0].securityContext.privileged", "a Revision's containers may not be privileged"}},
		{"privileged: false", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false), ProcMount: ptr.To(corev1.DefaultProcMount)}
		}, nil},
		{"procMount Unmasked", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}
		}, []string{"spec.template.spec.containers[0].securityContext.procMount", "may only have procMount Default"}},
		{"host-process container", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{WindowsOptions: &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}}
		}, []string{"spec.template.spec.containers[0].securityContext.windowsOptions.hostProcess", "may not be host processes"}},
		{"host-process pod", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.SecurityContext = &corev1.PodSecurityContext{WindowsOptions: &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}}
		}, []string{"spec.template.spec.securityContext.windowsOptions.hostProcess", "a Revision's pods may not be host processes"}},
		{"nfs volume", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Volumes = []corev1.Volume{
				{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}},
				{Name: "n", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/"}}},
			}
		}, []string{"spec.template.spec.volumes[1]", "a Revision's volume must be configMap, secret, projected, downwardAPI, emptyDir, hostPath or persistentVolumeClaim"}},
		{"volumes a setting allows pass the API server", func(s *v1alpha1.ServiceSpec) {
			s.Template.Spec.Volumes = []corev1.Volume{
				{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}},
				{Name: "p", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
				{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			}
			s.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
		}, nil},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			expect(t, c.Create(ctx, svc(tt.mutate)), tt.want)
		})
	}

	// The rules are on the types a Service's template shares with a
	// Revision's spec, so they hold for Revisions written directly too.
	t.Run("Revision: privileged container and nfs volume", func(t *testing.T) {
		s := svc(func(*v1alpha1.ServiceSpec) {})
		spec := s.Spec.Template.Spec
		spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		spec.Volumes = []corev1.Volume{{Name: "n", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/"}}}}
		rev := &v1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-privileged"}, Spec: spec}
		expect(t, c.Create(ctx, rev), []string{"spec.containers[0].securityContext.privileged", "may not be privileged", "spec.volumes[0]", "a Revision's volume must be"})
	})

	t.Run("names that cannot be a Kubernetes Service's", func(t *testing.T) {
		for _, name := range []string{"1hello", "hello.world", strings.Repeat("a", 64)} {
			s := svc(func(*v1alpha1.ServiceSpec) {})
			s.Name, s.GenerateName = name, ""
			expect(t, c.Create(ctx, s), []string{"metadata.name", "a DNS-1035 label"})
			r := &v1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
				Spec: v1alpha1.RouteSpec{Traffic: []v1alpha1.TrafficTarget{{ConfigurationName: "hello", Percent: ptr.To(int64(100))}}}}
			expect(t, c.Create(ctx, r), []string{"metadata.name", "a DNS-1035 label"})
			rev := &v1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: s.Spec.Template.Spec}
			expect(t, c.Create(ctx, rev), []string{"metadata.name", "a DNS-1035 label"})
		}
	})

	t.Run("template name not prefixed by the Service's", func(t *testing.T) {
		s := svc(func(*v1alpha1.ServiceSpec) {})
		s.Name, s.GenerateName, s.Spec.Template.Metadata.Name = "greet", "", "hello-v2"
		expect(t, c.Create(ctx, s), []string{"spec.template.metadata.name", "must start with the Service's name and a dash"})
		s.Spec.Template.Metadata.Name = "greet-v2"
		expect(t, c.Create(ctx, s), nil)
	})

	t.Run("Route", func(t *testing.T) {
		route := func(traffic ...v1alpha1.TrafficTarget) *v1alpha1.Route {
			return &v1alpha1.Route{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "split-"},
				Spec:       v1alpha1.RouteSpec{Traffic: traffic},
			}
		}
		latest := func(percent int64, config string) v1alpha1.TrafficTarget {
			return v1alpha1.TrafficTarget{Percent: &percent, ConfigurationName: config}
		}
		for _, tt := range []struct {
			name  string
			route *v1alpha1.Route
			want  []string
		}{
			{"configurationName without latestRevision (Knative's default: latest)", route(latest(100, "hello")), nil},
			{"no traffic", route(), []string{"spec.traffic", "Required value"}},
			{"empty traffic", route([]v1alpha1.TrafficTarget{}...), []string{"spec.traffic", "should have at least 1 items"}},
			{"neither revisionName nor configurationName", route(v1alpha1.TrafficTarget{Percent: ptr.To(int64(100))}),
				[]string{"spec.traffic", "each target of a Route names a revisionName or a configurationName"}},
			{"both revisionName and configurationName", route(latest(50, "hello"), v1alpha1.TrafficTarget{Percent: ptr.To(int64(50)), RevisionName: "hello-00001", ConfigurationName: "hello"}),
				[]string{"spec.traffic[1]", "sets both revisionName and configurationName"}},
			{"configurationName and latestRevision: false", route(v1alpha1.TrafficTarget{Percent: ptr.To(int64(100)), ConfigurationName: "hello", LatestRevision: ptr.To(false)}),
				[]string{"spec.traffic[0]", "has latestRevision: false and no revisionName"}},
			{"percents sum to 99", route(latest(90, "hello"), latest(9, "other")), []string{"spec.traffic", "the traffic percents must sum to 100"}},
			{"duplicate tag", route(v1alpha1.TrafficTarget{Percent: ptr.To(int64(100)), ConfigurationName: "hello", Tag: "a"}, v1alpha1.TrafficTarget{RevisionName: "hello-00001", Tag: "a"}),
				[]string{"spec.traffic", "tags must be unique: two targets have the same tag"}},
		} {
			t.Run(tt.name, func(t *testing.T) { expect(t, c.Create(ctx, tt.route), tt.want) })
		}
	})

	t.Run("Revision spec is immutable", func(t *testing.T) {
		var s v1alpha1.Service
		decode(t, "hello-service.yaml", &s)
		rev := &v1alpha1.Revision{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001", Labels: map[string]string{v1alpha1.ServiceLabelKey: "hello"}},
			Spec:       s.Spec.Template.Spec,
		}
		if err := c.Create(ctx, rev); err != nil {
			t.Fatalf("refused: %v", err)
		}
		rev.Labels["team"] = "a"
		expect(t, c.Update(ctx, rev), nil) // metadata may change
		changed := rev.DeepCopy()
		changed.Spec.Containers[0].Image = "ghcr.io/knative/helloworld-go:v2"
		expect(t, c.Update(ctx, changed), []string{"spec", "a Revision's spec is immutable: change the Service's template to make a new Revision"})
		changed = rev.DeepCopy()
		changed.Spec.ContainerConcurrency = ptr.To(int64(10))
		expect(t, c.Update(ctx, changed), []string{"spec", "a Revision's spec is immutable"})

		// The status subresource is the controller's to write, and the
		// printer columns show it as kubectl get ssrev does.
		rev.Status = v1alpha1.RevisionStatus{
			DeploymentName: "hello-00001-deployment", PodAutoscalerName: "hello-00001",
			ServiceName: "hello-00001", PrivateServiceName: "hello-00001-private",
			ActualReplicas: ptr.To(int32(2)), DesiredReplicas: ptr.To(int32(3)), RoutingState: v1alpha1.RoutingStateActive,
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}},
		}
		if err := c.Status().Update(ctx, rev); err != nil {
			t.Fatalf("status update refused: %v", err)
		}
		want := map[string]string{"Name": "hello-00001", "Service": "hello", "Routing": "active", "Concurrency": "50", "Ready": "True", "Reason": "Ready", "Actual": "2", "Desired": "3"}
		if diff := cmp.Diff(want, cl.TableRow(t, v1alpha1.GroupVersion, "revisions", "default", "hello-00001")); diff != "" {
			t.Errorf("kubectl get ssrev row (-want +got):\n%s", diff)
		}
	})

	t.Run("Route columns", func(t *testing.T) {
		var r v1alpha1.Route
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello-split"}, &r); err != nil {
			t.Fatal(err)
		}
		r.Status.URL = "http://hello-split.default.svc.cluster.local"
		r.Status.Traffic = []v1alpha1.TrafficTargetStatus{{RevisionName: "hello-00001", Percent: ptr.To(int64(70))}, {RevisionName: "hello-00002", Percent: ptr.To(int64(30))}}
		r.Status.TrafficSummary = "hello-00001=70%,hello-00002=30%"
		r.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "RevisionMissing",
			Message: "revision hello-00001 does not exist", LastTransitionTime: metav1.Now()}}
		if err := c.Status().Update(ctx, &r); err != nil {
			t.Fatalf("status update refused: %v", err)
		}
		want := map[string]string{"Name": "hello-split", "URL": "http://hello-split.default.svc.cluster.local", "Ready": "False", "Reason": "RevisionMissing",
			"Traffic": "hello-00001=70%,hello-00002=30%"}
		if diff := cmp.Diff(want, cl.TableRow(t, v1alpha1.GroupVersion, "routes", "default", "hello-split")); diff != "" {
			t.Errorf("kubectl get ssrt row (-want +got):\n%s", diff)
		}
	})

	t.Run("Service columns", func(t *testing.T) {
		var s v1alpha1.Service
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello"}, &s); err != nil {
			t.Fatal(err)
		}
		s.Status.URL = "http://hello.default.svc.cluster.local"
		s.Status.LatestCreatedRevisionName, s.Status.LatestReadyRevisionName = "hello-world", "hello-00005"
		s.Status.Traffic = []v1alpha1.TrafficTargetStatus{
			{RevisionName: "hello-00005", LatestRevision: ptr.To(true), Percent: ptr.To(int64(100))},
		}
		s.Status.TrafficSummary = "hello-00005=100%"
		s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionUnknown, Reason: "RolloutInProgress",
			Message: "A gradual rollout of the latest revision(s) is in progress.", LastTransitionTime: metav1.Now()}}
		if err := c.Status().Update(ctx, &s); err != nil {
			t.Fatalf("status update refused: %v", err)
		}
		want := map[string]string{"Name": "hello", "URL": "http://hello.default.svc.cluster.local", "LatestCreated": "hello-world",
			"LatestReady": "hello-00005", "Ready": "Unknown", "Reason": "RolloutInProgress", "Traffic": "hello-00005=100%"}
		if diff := cmp.Diff(want, cl.TableRow(t, v1alpha1.GroupVersion, "services", "default", "hello")); diff != "" {
			t.Errorf("kubectl get ssvc row (-want +got):\n%s", diff)
		}
	})
}

// expect fails t unless err is nil (want nil) or says every string of want.
func expect(t *testing.T, err error, want []string) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Errorf("refused: %v", err)
	case want != nil && err == nil:
		t.Errorf("accepted, want an error saying %q", want)
	case want != nil:
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("err = %v\nwant it to say %q", err, w)
			}
		}
	}
}

func manifest(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	decode(t, name, &u.Object)
	return u
}

// decode reads testdata/name strictly: a field the Go types lack fails.
func decode(t *testing.T, name string, into any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
