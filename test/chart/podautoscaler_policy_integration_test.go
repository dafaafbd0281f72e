package chart_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationPodAutoscalerTargetPolicy: on a real kube-apiserver, the
// chart's policy lets a tenant name as a PodAutoscaler's target only a kind
// of controller.scaleTargets whose scale subresource the tenant may update
// itself (so the controller's rights are not lent to it), checks a
// changed target again, and leaves edits that keep the target alone.
func TestIntegrationPodAutoscalerTargetPolicy(t *testing.T) {
	objs := render(t, append(vapAPI, "--show-only", "templates/podautoscaler-admissionpolicy.yaml")...)
	cl := testenv.ControlPlane(t)
	admin, ctx := cl.Client, context.Background()
	for _, o := range objs {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(o.raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, u); err != nil {
			t.Fatalf("create %s %s: %v", o.Kind, o.Name, err)
		}
	}
	// The tenant may write PodAutoscalers and scale StatefulSets, not
	// Deployments.
	tenant, err := client.New(cl.ConfigAs(t, "tenant", []rbacv1.PolicyRule{
		{APIGroups: []string{"sockscale.dev"}, Resources: []string{"podautoscalers"}, Verbs: []string{"create", "get", "update"}},
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets/scale"}, Verbs: []string{"get", "update"}},
	}), client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	pa := func(name, apiVersion, kind string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "sockscale.dev/v1alpha1", "kind": "PodAutoscaler",
			"metadata": map[string]any{"namespace": "default", "name": name},
			"spec": map[string]any{
				"scaleTargetRef": map[string]any{"apiVersion": apiVersion, "kind": kind, "name": name},
				"service":        map[string]any{"name": name},
			},
		}}
		return u
	}
	testenv.Eventually(t, 30*time.Second, "the policy refuses the tenant a Deployment it may not scale", func() (bool, string) {
		err := tenant.Create(ctx, pa("probe", "apps/v1", "Deployment"))
		return err != nil && strings.Contains(err.Error(), "may not update the scale"), errString(err)
	})
	for _, tt := range []struct {
		name string
		obj  *unstructured.Unstructured
		want string // "" accepted
	}{
		{"a StatefulSet it may scale", pa("db", "apps/v1", "StatefulSet"), ""},
		{"a Deployment it may not scale", pa("web", "apps/v1", "Deployment"),
			"spec.scaleTargetRef: tenant may not update the scale of Deployment.apps web in namespace default"},
		{"a kind not in controller.scaleTargets", pa("roll", "argoproj.io/v1alpha1", "Rollout"),
			"sockscale scales only Deployment.apps,StatefulSet.apps in this cluster, not Rollout.argoproj.io"},
		{"a core kind not in controller.scaleTargets", pa("rc", "v1", "ReplicationController"),
			"not ReplicationController"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tenant.Create(ctx, tt.obj)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}

	t.Run("an edit that keeps the target passes; a new target is checked", func(t *testing.T) {
		// An admin's PodAutoscaler of a Deployment the tenant may not scale.
		if err := admin.Create(ctx, pa("shop", "apps/v1", "Deployment")); err != nil {
			t.Fatal(err)
		}
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(pa("", "", "").GroupVersionKind())
		if err := tenant.Get(ctx, client.ObjectKey{Namespace: "default", Name: "shop"}, got); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(got.Object, int64(2), "spec", "minScale")
		if err := tenant.Update(ctx, got); err != nil {
			t.Errorf("min-scale changed, target kept: %v", err)
		}
		_ = unstructured.SetNestedField(got.Object, "other", "spec", "scaleTargetRef", "name")
		if err := tenant.Update(ctx, got); err == nil || !strings.Contains(err.Error(), "may not update the scale of Deployment.apps other") {
			t.Errorf("target changed to another Deployment: err = %v, want refused", err)
		}
	})

	t.Run("the controller itself, for a Revision's Deployment", func(t *testing.T) {
		asController, err := client.New(cl.ConfigAs(t, controllerSA, testenv.GeneratedRules(t, "role.yaml")), client.Options{Scheme: admin.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		if err := asController.Create(ctx, pa("hello-00001", "apps/v1", "Deployment")); err != nil {
			t.Errorf("the controller's PodAutoscaler of a Revision's Deployment: %v", err)
		}
	})
}
