package chart_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestStatsToken: agents and activators mount a projected, pod-bound
// ServiceAccount token for the controller's audience and pass its file;
// the controller checks that audience and takes no unauthenticated stats
// unless told to.
func TestStatsToken(t *testing.T) {
	for _, tt := range []struct {
		name     string
		set      []string
		audience string
		insecure bool
	}{
		{"defaults", nil, "sockscale-controller", false},
		{"another audience, insecure", []string{"--set", "controller.statsAuth.audience=stats.example.com", "--set", "controller.statsAuth.insecureSkipAuth=true"}, "stats.example.com", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.set...)
			agent := get[appsv1.DaemonSet](t, objs, "DaemonSet", agentName).Spec.Template.Spec
			act := get[appsv1.Deployment](t, objs, "Deployment", activatorName).Spec.Template.Spec
			wantVolume := corev1.Volume{Name: "stats-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Audience: tt.audience, ExpirationSeconds: ptr.To(int64(3600)), Path: "token"}}}}}}
			wantMount := corev1.VolumeMount{Name: "stats-token", MountPath: "/var/run/secrets/sockscale.dev/stats-token", ReadOnly: true}
			for name, spec := range map[string]corev1.PodSpec{"agent": agent, "activator": act} {
				i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "stats-token" })
				if i < 0 {
					t.Errorf("%s: no stats-token volume", name)
					continue
				}
				if diff := cmp.Diff(wantVolume, spec.Volumes[i]); diff != "" {
					t.Errorf("%s: stats-token volume (-want +got):\n%s", name, diff)
				}
				c := spec.Containers[0]
				if !slices.Contains(c.VolumeMounts, wantMount) {
					t.Errorf("%s: mounts %+v, want %+v", name, c.VolumeMounts, wantMount)
				}
				if !slices.Contains(c.Args, "--controller-token-file=/var/run/secrets/sockscale.dev/stats-token/token") {
					t.Errorf("%s: args %q lack --controller-token-file", name, c.Args)
				}
			}
			ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec.Containers[0]
			if !slices.Contains(ctl.Args, "--stats-token-audience="+tt.audience) {
				t.Errorf("controller args %q lack --stats-token-audience=%s", ctl.Args, tt.audience)
			}
			if got := slices.Contains(ctl.Args, "--stats-insecure-skip-auth"); got != tt.insecure {
				t.Errorf("controller --stats-insecure-skip-auth: %v, want %v", got, tt.insecure)
			}
		})
	}
	if out, err := helm(t, templateArgs(t, "--set", "controller.statsAuth.audience=a b")...); err == nil || !strings.Contains(out+err.Error(), "statsAuth/audience") {
		t.Errorf("an audience with a space: err %v, want the schema to name controller.statsAuth.audience", err)
	}
}
