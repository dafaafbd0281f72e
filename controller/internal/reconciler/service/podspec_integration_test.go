package service_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/configwatch"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/revision"
	"github.com/sockscale/sockscale/controller/internal/reconciler/service"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationHostPathNotDeployedUntilEnabled: under the default
// configuration (the chart's ConfigMap) a Service whose template mounts
// a hostPath gets its Revision but no Deployment; the Revision's Ready
// and the Service's ConfigurationsReady say FieldNotAllowed, naming the
// field and the key. Enabling the key in the ConfigMap deploys it.
func TestIntegrationHostPathNotDeployedUntilEnabled(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sockscale-autoscaler"}, Data: config.DefaultConfigMapData()}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	var cfg atomic.Pointer[config.Config]
	loaded, err := configwatch.Load(ctx, c, "default/sockscale-autoscaler")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store(loaded)
	cl.StartManager(t,
		func(mgr ctrl.Manager) error {
			return mgr.Add(&configwatch.Watcher{Reader: mgr.GetAPIReader(), Ref: "default/sockscale-autoscaler", Current: &cfg,
				Period: 200 * time.Millisecond, Clock: clock.RealClock{}})
		},
		func(mgr ctrl.Manager) error {
			return (&revision.Reconciler{Client: mgr.GetClient(), Config: cfg.Load, Recheck: time.Second}).SetupWithManager(mgr)
		},
		func(mgr ctrl.Manager) error {
			return (&service.Reconciler{Client: mgr.GetClient(), Config: cfg.Load}).SetupWithManager(mgr)
		})

	svc := &servingv1alpha1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{Spec: servingv1alpha1.RevisionSpec{
			Containers: []servingv1alpha1.Container{{Image: "hello:v1", VolumeMounts: []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}}},
			Volumes:    []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}},
		}}},
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	const why = "spec.volumes[0].hostPath needs podspec-volumes-hostpath: enabled in the autoscaler ConfigMap"
	eventually(t, "the Service says why hello-00001 is not deployed", func() (bool, string) {
		s := getService(t, c, "hello")
		cr := meta.FindStatusCondition(s.Status.Conditions, service.ConditionConfigurationsReady)
		return cr != nil && cr.Status == metav1.ConditionFalse && cr.Reason == revision.ReasonFieldNotAllowed &&
			strings.Contains(cr.Message, `Revision "hello-00001"`) && strings.Contains(cr.Message, why), conditions(&s.Status)
	})
	var rev servingv1alpha1.Revision
	if err := c.Get(ctx, key("hello-00001"), &rev); err != nil {
		t.Fatal(err)
	}
	if r := meta.FindStatusCondition(rev.Status.Conditions, names.ConditionReady); r == nil || r.Reason != revision.ReasonFieldNotAllowed || !strings.Contains(r.Message, why) {
		t.Errorf("Revision Ready = %+v, want reason %s saying %q", r, revision.ReasonFieldNotAllowed, why)
	}
	// Give a wrongly made Deployment time to show (several rechecks).
	time.Sleep(3 * time.Second)
	if err := c.Get(ctx, key("hello-00001-deployment"), &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Deployment hello-00001-deployment: err = %v, want not found", err)
	}

	cm.Data[config.KeyVolumesHostPath] = "enabled"
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hello-00001 deployed with its hostPath once the key is on", func() (bool, string) {
		var d appsv1.Deployment
		if err := c.Get(ctx, key("hello-00001-deployment"), &d); err != nil {
			return false, err.Error()
		}
		v := d.Spec.Template.Spec.Volumes
		return len(v) == 1 && v[0].HostPath != nil && v[0].HostPath.Path == "/etc", fmt.Sprintf("volumes %+v", v)
	})
	eventually(t, "the Service's ConfigurationsReady no longer FieldNotAllowed", func() (bool, string) {
		s := getService(t, c, "hello")
		cr := meta.FindStatusCondition(s.Status.Conditions, service.ConditionConfigurationsReady)
		return cr != nil && cr.Reason != revision.ReasonFieldNotAllowed, conditions(&s.Status)
	})
}
