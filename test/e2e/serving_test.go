package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EServingService applies a serving Service as a Knative user would
// (a template with one container, the autoscaling annotations) on the
// cluster the chart installed. Its first Revision gets its Deployment,
// public Service and PodAutoscaler from the controller, becomes Ready and
// answers through its public Service; a changed template makes a second
// Revision, which becomes the latest ready and answers too, while the first
// stays as it was.
func TestE2EServingService(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	if err := s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	svc := &servingv1alpha1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "greet"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{
			Metadata: servingv1alpha1.RevisionTemplateMetadata{Annotations: map[string]string{"autoscaling.knative.dev/min-scale": "1"}},
			Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{
				Image: stack.AppImage,
				Env:   []corev1.EnvVar{{Name: "GREETING", Value: "v1"}},
			}}},
		}},
	}
	if err := s.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Client.Delete(context.Background(), svc) })

	// latestReady waits until the Service's latest ready Revision is want
	// and Ready, then checks that Revision's public Service answers.
	latestReady := func(want string) {
		t.Helper()
		e2etest.Eventually(t, 3*time.Minute, "Service greet: latest ready Revision "+want, func() error {
			var got servingv1alpha1.Service
			if err := s.Client.Get(ctx, client.ObjectKeyFromObject(svc), &got); err != nil {
				return err
			}
			ready := meta.FindStatusCondition(got.Status.Conditions, "Ready")
			if got.Status.LatestReadyRevisionName != want || ready == nil || ready.Status != metav1.ConditionTrue {
				return fmt.Errorf("latest created %q, latest ready %q, Ready %+v", got.Status.LatestCreatedRevisionName, got.Status.LatestReadyRevisionName, ready)
			}
			return nil
		})
		var rev servingv1alpha1.Revision
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: want}, &rev); err != nil {
			t.Fatal(err)
		}
		var public corev1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rev.Status.ServiceName}, &public); err != nil {
			t.Fatalf("Revision %s's public Service %q: %v", want, rev.Status.ServiceName, err)
		}
		ip, err := netip.ParseAddr(public.Spec.ClusterIP)
		if err != nil {
			t.Fatalf("Service %s's cluster IP %q: %v", public.Name, public.Spec.ClusterIP, err)
		}
		localRoute(t, ip)
		url := fmt.Sprintf("http://%s:80/", ip)
		e2etest.Eventually(t, time.Minute, "Revision "+want+" answers at "+url, func() error {
			if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != 200 {
				return fmt.Errorf("GET %s: %s", url, a)
			}
			return nil
		})
	}
	latestReady("greet-00001")
	var first servingv1alpha1.Revision
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "greet-00001"}, &first); err != nil {
		t.Fatal(err)
	}

	e2etest.Eventually(t, 30*time.Second, "change Service greet's template", func() error {
		var cur servingv1alpha1.Service
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(svc), &cur); err != nil {
			return err
		}
		cur.Spec.Template.Spec.Containers[0].Env[0].Value = "v2"
		return s.Client.Update(ctx, &cur)
	})
	latestReady("greet-00002")
	var after servingv1alpha1.Revision
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "greet-00001"}, &after); err != nil {
		t.Fatalf("Revision greet-00001 after the change: %v", err)
	}
	if after.Generation != first.Generation || after.Spec.Containers[0].Env[0].Value != "v1" {
		t.Errorf("Revision greet-00001 changed: generation %d -> %d, GREETING %q", first.Generation, after.Generation, after.Spec.Containers[0].Env[0].Value)
	}
}
