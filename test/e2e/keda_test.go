package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/keda"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EKEDAScaleToZero: KEDA's own operator (the version go.mod pins,
// built from its source, run in the cluster with its CRDs and RBAC) scales
// a Deployment through a ScaledObject whose external-push trigger is
// sockscale's scaler, authenticated with the chart's client certificate
// from a ClusterTriggerAuthentication; sockscale only keeps the activator
// in front while no pod is ready (class external). Without load KEDA takes
// the Deployment to zero after its cooldown; requests at zero are held,
// pushed to KEDA as activity the moment they arrive, and all answered by
// the pod KEDA brings.
func TestE2EKEDAScaleToZero(t *testing.T) {
	s := up(t)
	t.Parallel() // with the package's other HPA and KEDA scenarios, after the rest: each has its own apps
	ctx := context.Background()
	start := time.Now()
	if err := keda.Install(ctx, s.Client, stack.ImageRepo); err != nil {
		t.Fatalf("install KEDA: %v", err)
	}
	e2etest.Eventually(t, 3*time.Minute, "KEDA's operator ready", func() error {
		var d appsv1.Deployment
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: keda.Namespace, Name: "keda-operator"}, &d); err != nil {
			return err
		}
		if d.Status.ReadyReplicas < 1 {
			return fmt.Errorf("%d ready", d.Status.ReadyReplicas)
		}
		return nil
	})
	t.Logf("KEDA's operator ready after %s", time.Since(start).Round(time.Second))

	// The chart's client certificate, where a ClusterTriggerAuthentication
	// reads it (controller.kedaScaler.clientSecretNamespace does this in
	// an install that names KEDA's namespace).
	const clientSecret = "sockscale-controller-keda-client"
	var secret corev1.Secret
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: clientSecret}, &secret); err != nil {
		t.Fatal(err)
	}
	copied := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: keda.Namespace, Name: clientSecret}, Type: secret.Type, Data: secret.Data}
	if err := s.Client.Create(ctx, copied); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	auth := kedaObject("ClusterTriggerAuthentication", "", "sockscale", map[string]any{
		"secretTargetRef": []any{
			map[string]any{"parameter": "caCert", "name": clientSecret, "key": "ca.crt"},
			map[string]any{"parameter": "tlsClientCert", "name": clientSecret, "key": "tls.crt"},
			map[string]any{"parameter": "tlsClientKey", "name": clientSecret, "key": "tls.key"},
		},
	})
	if err := s.Client.Create(ctx, auth); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	const name = "keda-web"
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) { p.Class = v1alpha1.ClassExternal })
	so := kedaObject("ScaledObject", appNS, name, map[string]any{
		"scaleTargetRef":  map[string]any{"name": name},
		"minReplicaCount": int64(0),
		"maxReplicaCount": int64(3),
		"pollingInterval": int64(5),
		"cooldownPeriod":  int64(10),
		"triggers": []any{map[string]any{
			"type": "external-push",
			"metadata": map[string]any{
				"scalerAddress": "sockscale-controller-keda." + stack.Namespace + ".svc:9443",
				"deployment":    name,
				"metric":        "concurrency",
				"target":        "7",
			},
			"authenticationRef": map[string]any{"name": "sockscale", "kind": "ClusterTriggerAuthentication"},
		}},
	})
	if err := s.Client.Create(ctx, so); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Client.Delete(context.Background(), so)
		_ = s.Remove(context.Background(), stack.App{Namespace: appNS, Name: name})
		// KEDA stays installed, idle; its operator goes.
		_ = s.Client.Delete(context.Background(), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: keda.Namespace, Name: "keda-operator"}})
	})

	// Idle: KEDA reads the scaler as inactive and, after its cooldown,
	// takes the Deployment to zero; the activators take the public
	// Service.
	waitAtZero(t, s, 3*time.Minute, name)
	if st, line := scaledObjectCondition(t, s, name, "Ready"); st != "True" {
		t.Errorf("ScaledObject Ready = %s, want True (KEDA reads sockscale's scaler)", line)
	}

	coldStart(t, s, url, name, "KEDA, external-push")
	// KEDA brought the pod: it saw the held requests as activity.
	if st, line := scaledObjectCondition(t, s, name, "Active"); st != "True" && replicas(t, s, name) == 0 {
		t.Errorf("after the requests at zero: ScaledObject Active = %s with no pod wanted", line)
	}
	// And takes it back after its cooldown.
	waitAtZero(t, s, 2*time.Minute, name)
}

// kedaObject is a keda.sh/v1alpha1 object with spec.
func kedaObject(kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion("keda.sh/v1alpha1")
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// scaledObjectCondition is the status of the ScaledObject's condition typ,
// and the condition in a line.
func scaledObjectCondition(t *testing.T, s *stack.Stack, name, typ string) (string, string) {
	t.Helper()
	u := kedaObject("ScaledObject", appNS, name, nil)
	if err := s.Client.Get(context.Background(), client.ObjectKeyFromObject(u), u); err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return fmt.Sprint(m["status"]), fmt.Sprintf("%v (%v: %v)", m["status"], m["reason"], m["message"])
		}
	}
	return "", "absent"
}
