package chart_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// `helm uninstall` first runs the controller's image with --release, as a
// pre-delete hook with the controller's ServiceAccount (whose RBAC still
// exists then): public Services get their targets' selectors back.
func TestControllerReleaseHook(t *testing.T) {
	objs := render(t)
	job := get[batchv1.Job](t, objs, "Job", controllerName+"-release")
	if got := job.Annotations["helm.sh/hook"]; got != "pre-delete" {
		t.Errorf("helm.sh/hook = %q; want pre-delete", got)
	}
	spec := job.Spec.Template.Spec
	ctl := get[appsv1.Deployment](t, objs, "Deployment", controllerName).Spec.Template.Spec
	if spec.ServiceAccountName != ctl.ServiceAccountName || spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("serviceAccountName %q, restartPolicy %q; want the controller's %q and Never", spec.ServiceAccountName, spec.RestartPolicy, ctl.ServiceAccountName)
	}
	c := spec.Containers[0]
	if diff := cmp.Diff([]string{"--release", "--release-stop=" + namespace + "/" + controllerName}, c.Args); diff != "" || c.Image != ctl.Containers[0].Image {
		t.Errorf("container image %q (want the controller's %q), args (-want +got):\n%s", c.Image, ctl.Containers[0].Image, diff)
	}
	// A failed release scales the controller back up as it stops
	// (release.startAgain: up to 15 s): the pod must get that long.
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 20 {
		t.Errorf("terminationGracePeriodSeconds = %v; want at least 20 s to scale the controller back up", g)
	}
	if job.Spec.Template.Labels["app.kubernetes.io/component"] == "controller" {
		t.Error("the Job's pod is labelled as a controller replica: the controller's Services and PodDisruptionBudget would select it")
	}
	if objs := render(t, "--set", "controller.releaseOnUninstall=false"); objs.find("Job", controllerName+"-release") != nil {
		t.Error("controller.releaseOnUninstall=false still renders the release Job")
	}
}
