package integration

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/stack"
)

// The Pod Security Standards level each workload needs, proved by the
// real PodSecurity admission plugin of kube-apiserver (on by default):
// Pods made from the chart's pod templates and from the test app's spec
// are created in namespaces enforcing each level. The controller, the
// activator and a user's app pass restricted; the agent (hostPath
// volumes, root, capabilities beyond the default set) only privileged.
func TestIntegrationPodSecurityLevels(t *testing.T) {
	c := testenv.ControlPlane(t)
	ctx := context.Background()
	objs := renderChart(t, "sockscale-system")
	specs := map[string]corev1.PodSpec{"app": stack.AppPodSpec(stack.AppImage)}
	for _, w := range []struct{ kind, name, key string }{
		{"Deployment", "sockscale-controller", "controller"},
		{"Deployment", "sockscale-activator", "activator"},
		{"DaemonSet", "sockscale-agent", "agent"},
	} {
		u := rendered(t, objs, w.kind, w.name)
		var tmpl corev1.PodTemplateSpec
		switch w.kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
				t.Fatal(err)
			}
			tmpl = d.Spec.Template
		case "DaemonSet":
			var d appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
				t.Fatal(err)
			}
			tmpl = d.Spec.Template
		}
		specs[w.key] = tmpl.Spec
	}
	// A pod with no security context at all: restricted must refuse it,
	// or the plugin is not enforcing and the rest proves nothing.
	specs["bare"] = corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}

	for _, level := range []string{"restricted", "baseline", "privileged"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "psa-" + level, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce":         level,
			"pod-security.kubernetes.io/enforce-version": "latest",
		}}}
		if err := c.Client.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		pod, level string
		// why: the substrings of the refusal; nil: admitted.
		why []string
	}{
		{"bare", "restricted", []string{`violates PodSecurity "restricted:latest"`, "runAsNonRoot", "seccompProfile"}},
		{"controller", "restricted", nil},
		{"activator", "restricted", nil},
		{"app", "restricted", nil},
		{"agent", "restricted", []string{`violates PodSecurity "restricted:latest"`}},
		{"agent", "baseline", []string{`violates PodSecurity "baseline:latest"`, "non-default capabilities", "hostPath volumes"}},
		{"agent", "privileged", nil},
	} {
		t.Run(tt.pod+" under "+tt.level, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "psa-" + tt.level, Name: tt.pod}, Spec: specs[tt.pod]}
			err := c.Client.Create(ctx, pod)
			if tt.why == nil {
				if err != nil {
					t.Fatalf("refused under %s: %v", tt.level, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("admitted under %s; want refused for %q", tt.level, tt.why)
			}
			if !apierrors.IsForbidden(err) {
				t.Errorf("error %v, want Forbidden", err)
			}
			for _, w := range tt.why {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
		})
	}
}
