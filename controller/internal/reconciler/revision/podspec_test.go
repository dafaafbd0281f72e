package revision

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TestNotAllowed: each gated field is refused under the defaults with
// the key that allows it, and allowed once that key is on; fields no key
// allows are refused whatever the keys.
func TestNotAllowed(t *testing.T) {
	vol := func(name string, src corev1.VolumeSource) func(*servingv1alpha1.RevisionSpec) {
		return func(s *servingv1alpha1.RevisionSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: name, VolumeSource: src})
		}
	}
	podSC := func(sc corev1.PodSecurityContext) func(*servingv1alpha1.RevisionSpec) {
		return func(s *servingv1alpha1.RevisionSpec) { s.SecurityContext = &sc }
	}
	ctrSC := func(sc corev1.SecurityContext) func(*servingv1alpha1.RevisionSpec) {
		return func(s *servingv1alpha1.RevisionSpec) { s.Containers[0].SecurityContext = &sc }
	}
	all := config.PodSpec{VolumesEmptyDir: true, VolumesHostPath: true, PersistentVolumeClaim: true, NodeSelector: true, Tolerations: true, SecurityContext: true, AddCapabilities: true}
	for _, tt := range []struct {
		name   string
		mutate func(*servingv1alpha1.RevisionSpec)
		// enable turns on the key that allows the field; nil for
		// fields that need none or that no key allows.
		enable func(*config.PodSpec)
		want   string // under the defaults; "" allowed
	}{
		{"nothing special", func(*servingv1alpha1.RevisionSpec) {}, nil, ""},
		{"configMap, secret, projected and downwardAPI volumes", func(s *servingv1alpha1.RevisionSpec) {
			vol("c", corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}})(s)
			vol("s", corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}})(s)
			vol("p", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}})(s)
			vol("d", corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{}})(s)
		}, nil, ""},
		{"emptyDir (on by default)", vol("e", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}), nil, ""},
		{"hostPath", vol("h", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}),
			func(f *config.PodSpec) { f.VolumesHostPath = true },
			"spec.volumes[0].hostPath needs podspec-volumes-hostpath: enabled in the autoscaler ConfigMap"},
		{"persistentVolumeClaim", vol("p", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}),
			func(f *config.PodSpec) { f.PersistentVolumeClaim = true },
			"spec.volumes[0].persistentVolumeClaim needs podspec-persistent-volume-claim: enabled in the autoscaler ConfigMap"},
		{"nfs: no key", vol("n", corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "x", Path: "/"}}), nil,
			"spec.volumes[0].nfs is never allowed"},
		{"nodeSelector", func(s *servingv1alpha1.RevisionSpec) { s.NodeSelector = map[string]string{"gpu": "yes"} },
			func(f *config.PodSpec) { f.NodeSelector = true },
			"spec.nodeSelector needs podspec-nodeselector: enabled in the autoscaler ConfigMap"},
		{"tolerations", func(s *servingv1alpha1.RevisionSpec) {
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		},
			func(f *config.PodSpec) { f.Tolerations = true },
			"spec.tolerations needs podspec-tolerations: enabled in the autoscaler ConfigMap"},
		{"pod securityContext: the safe subset", podSC(corev1.PodSecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000)),
			RunAsNonRoot: ptr.To(true), FSGroup: ptr.To(int64(2000)), SupplementalGroups: []int64{3000},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}), nil, ""},
		{"pod sysctls", podSC(corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.securityContext.sysctls needs podspec-securitycontext: enabled in the autoscaler ConfigMap"},
		{"pod seLinuxOptions", podSC(corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.securityContext.seLinuxOptions needs podspec-securitycontext: enabled in the autoscaler ConfigMap"},
		{"pod seccomp Unconfined", podSC(corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.securityContext.seccompProfile.type needs podspec-securitycontext: enabled in the autoscaler ConfigMap"},
		{"pod hostProcess: no key", podSC(corev1.PodSecurityContext{WindowsOptions: &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.securityContext.windowsOptions needs podspec-securitycontext: enabled in the autoscaler ConfigMap; " +
				"spec.securityContext.windowsOptions.hostProcess is never allowed"},
		{"container securityContext: the safe subset", ctrSC(corev1.SecurityContext{
			Capabilities:           &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}},
			ReadOnlyRootFilesystem: ptr.To(true), RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000)), RunAsNonRoot: ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false), Privileged: ptr.To(false), ProcMount: ptr.To(corev1.DefaultProcMount),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}), nil, ""},
		{"privileged: no key", ctrSC(corev1.SecurityContext{Privileged: ptr.To(true)}), nil,
			"spec.containers[0].securityContext.privileged is never allowed"},
		{"procMount Unmasked: no key", ctrSC(corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}), nil,
			"spec.containers[0].securityContext.procMount is never allowed"},
		{"container hostProcess: no key", ctrSC(corev1.SecurityContext{WindowsOptions: &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.containers[0].securityContext.windowsOptions needs podspec-securitycontext: enabled in the autoscaler ConfigMap; " +
				"spec.containers[0].securityContext.windowsOptions.hostProcess is never allowed"},
		{"container appArmorProfile", ctrSC(corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.containers[0].securityContext.appArmorProfile needs podspec-securitycontext: enabled in the autoscaler ConfigMap"},
		{"container seccomp Unconfined", ctrSC(corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}),
			func(f *config.PodSpec) { f.SecurityContext = true },
			"spec.containers[0].securityContext.seccompProfile.type needs podspec-securitycontext: enabled in the autoscaler ConfigMap"},
		{"added capabilities", ctrSC(corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "SYS_ADMIN"}}}),
			func(f *config.PodSpec) { f.AddCapabilities = true },
			"spec.containers[0].securityContext.capabilities.add[1] (SYS_ADMIN) needs containerspec-addcapabilities: enabled in the autoscaler ConfigMap"},
		{"several, in spec order", func(s *servingv1alpha1.RevisionSpec) {
			vol("h", corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}})(s)
			s.NodeSelector = map[string]string{"a": "b"}
		}, func(f *config.PodSpec) { f.VolumesHostPath, f.NodeSelector = true, true },
			"spec.volumes[0].hostPath needs podspec-volumes-hostpath: enabled in the autoscaler ConfigMap; " +
				"spec.nodeSelector needs podspec-nodeselector: enabled in the autoscaler ConfigMap"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := rev("hello-00001").Obj()
			tt.mutate(&r.Spec)
			if diff := cmp.Diff(tt.want, fieldsNotAllowed(&r.Spec, config.Defaults().PodSpec)); diff != "" {
				t.Errorf("under the defaults (-want +got):\n%s", diff)
			}
			if tt.enable != nil {
				f := config.Defaults().PodSpec
				tt.enable(&f)
				if got := fieldsNotAllowed(&r.Spec, f); got != "" && !neverOnly(got) {
					t.Errorf("with its key enabled: %s", got)
				}
			}
			// With every key on, only what no key allows is left.
			if got := fieldsNotAllowed(&r.Spec, all); got != "" && !neverOnly(got) {
				t.Errorf("with every key enabled: %s", got)
			}
		})
	}

	t.Run("emptyDir disabled", func(t *testing.T) {
		r := rev("hello-00001").Obj()
		vol("e", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}})(&r.Spec)
		want := "spec.volumes[0].emptyDir needs podspec-volumes-emptydir: enabled in the autoscaler ConfigMap"
		if diff := cmp.Diff(want, fieldsNotAllowed(&r.Spec, config.PodSpec{})); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
}

// neverOnly: every field msg names is one no key allows.
func neverOnly(msg string) bool {
	for _, part := range strings.Split(msg, "; ") {
		if !strings.HasSuffix(part, " is never allowed") {
			return false
		}
	}
	return true
}

// TestReconcileFieldNotAllowed: a Revision with a hostPath volume under
// the defaults gets no Deployment (nor anything else), Ready=False with
// reason FieldNotAllowed naming the field and the key, and a recheck; one
// whose Deployment it already controls keeps it untouched, with its
// Service and PodAutoscaler, and says so in PodSpecAllowed.
func TestReconcileFieldNotAllowed(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, servingv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	hostPath := func() *servingv1alpha1.Revision {
		r := rev("hello-00001").Obj()
		r.UID = "rev-uid"
		r.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}}
		return r
	}
	const wantField = "spec.volumes[0].hostPath needs podspec-volumes-hostpath: enabled in the autoscaler ConfigMap"
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello-00001"}}
	get := func(t *testing.T, c client.Client, obj client.Object, name string) error {
		t.Helper()
		return c.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, obj)
	}

	t.Run("not deployed", func(t *testing.T) {
		r := hostPath()
		c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&servingv1alpha1.Revision{}).WithObjects(r).Build()
		rec := &Reconciler{Client: c, Recheck: 5 * time.Second}
		res, err := rec.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != 5*time.Second {
			t.Errorf("RequeueAfter = %v, want the recheck 5s", res.RequeueAfter)
		}
		for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &v1alpha1.PodAutoscaler{}} {
			name := "hello-00001"
			if _, ok := o.(*appsv1.Deployment); ok {
				name = DeploymentName(name)
			}
			if err := get(t, c, o, name); !apierrors.IsNotFound(err) {
				t.Errorf("%T %s: err = %v, want not found", o, name, err)
			}
		}
		var got servingv1alpha1.Revision
		if err := get(t, c, &got, "hello-00001"); err != nil {
			t.Fatal(err)
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
		want := "pod-spec fields not allowed on this cluster, so no Deployment is made: " + wantField
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != ReasonFieldNotAllowed || ready.Message != want {
			t.Errorf("Ready = %+v, want False %s %q", ready, ReasonFieldNotAllowed, want)
		}

		// Turning the key on deploys it, and the condition goes.
		cfg := config.Defaults()
		cfg.PodSpec.VolumesHostPath = true
		rec.Config = func() *config.Config { return cfg }
		if res, err := rec.Reconcile(ctx, req); err != nil || res.RequeueAfter != 0 {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		var d appsv1.Deployment
		if err := get(t, c, &d, DeploymentName("hello-00001")); err != nil {
			t.Fatalf("no Deployment with the key on: %v", err)
		}
		if err := get(t, c, &got, "hello-00001"); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady); c == nil || c.Reason == ReasonFieldNotAllowed {
			t.Errorf("Ready = %+v after the key was turned on", c)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, ConditionPodSpecAllowed); c != nil {
			t.Errorf("PodSpecAllowed = %+v, want none", c)
		}
	})

	t.Run("deployed before the key was turned off", func(t *testing.T) {
		r := hostPath()
		d := MakeDeployment(r, 0)
		if err := controllerutil.SetControllerReference(r, d, scheme); err != nil {
			t.Fatal(err)
		}
		d.Spec.Replicas = ptr.To(int32(3))
		d.ResourceVersion = ""
		c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&servingv1alpha1.Revision{}).WithObjects(r, d).Build()
		before := &appsv1.Deployment{}
		if err := get(t, c, before, d.Name); err != nil {
			t.Fatal(err)
		}
		rec := &Reconciler{Client: c}
		res, err := rec.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != defaultRecheck {
			t.Errorf("RequeueAfter = %v, want %v", res.RequeueAfter, defaultRecheck)
		}
		after := &appsv1.Deployment{}
		if err := get(t, c, after, d.Name); err != nil {
			t.Fatalf("the running Deployment: %v", err)
		}
		if after.ResourceVersion != before.ResourceVersion {
			t.Error("the Deployment was written; it must be left as it is")
		}
		if err := get(t, c, &v1alpha1.PodAutoscaler{}, "hello-00001"); err != nil {
			t.Errorf("its PodAutoscaler: %v (scaling goes on)", err)
		}
		var got servingv1alpha1.Revision
		if err := get(t, c, &got, "hello-00001"); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady); c == nil || c.Reason == ReasonFieldNotAllowed {
			t.Errorf("Ready = %+v, want what its pods say", c)
		}
		c2 := meta.FindStatusCondition(got.Status.Conditions, ConditionPodSpecAllowed)
		want := "pod-spec fields not allowed on this cluster (a Deployment made before they were turned off is left as it is): " + wantField
		if c2 == nil || c2.Status != metav1.ConditionFalse || c2.Reason != ReasonFieldNotAllowed || c2.Message != want {
			t.Errorf("PodSpecAllowed = %+v, want False %q", c2, want)
		}
	})
}
