package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/stack"
)

// The controller binary runs as the chart's ServiceAccount with exactly
// the chart's rendered RBAC (its generated ClusterRole and its Role in the
// release namespace), with leader election: it takes the lease, scales a
// PodAutoscaler's Deployment from agent stats, makes a serving Service's
// Revision, Deployment and Route, writes their status, and is refused
// nothing on the way.
func TestIntegrationControllerUnderTheChartsRBAC(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: stack.Namespace}}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range renderChart(t, stack.Namespace) {
		switch {
		case o.GetKind() == "ServiceAccount" && o.GetName() == "sockscale-controller",
			(o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && o.GetName() == "sockscale-controller":
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("create the rendered %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			n++
		}
	}
	// Not the autoscaler ConfigMap: the controller's GET of it (which the
	// Role allows) finds none and keeps the defaults that
	// postUntilScaled's numbers assume.
	if n != 5 {
		t.Fatalf("created %d of the chart's controller objects, want 5", n)
	}
	token, err := stack.ServiceAccountToken(ctx, c, stack.Namespace, "sockscale-controller")
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cl.Config.Host, CertificateAuthorityData: cl.Config.CAData}
	kc.AuthInfos["controller"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["controller"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "controller"}
	kc.CurrentContext = "controller"
	kubeconfig := filepath.Join(t.TempDir(), "controller.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	cl.CreateDeployment(t, "default", "hello", 1, 1)
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
		}}
	web := &servingv1alpha1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{Spec: servingv1alpha1.RevisionSpec{
			Containers: []servingv1alpha1.Container{{Image: "web"}}}}}}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, web); err != nil {
		t.Fatal(err)
	}

	t.Setenv("POD_NAMESPACE", stack.Namespace) // the lease's and the ConfigMap's namespace
	statsAddr, logFile := startControllerAs(t, kubeconfig, "--leader-elect")
	// Scaled up through deployments/scale; the exact count is the other
	// test's subject.
	postUntilScaled(t, cl, statsAddr, func(n int32) bool { return n >= 3 })

	testenv.Eventually(t, 30*time.Second, "the serving Service's Revision, Deployment and Route, with status", func() (bool, string) {
		var rev servingv1alpha1.Revision
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "web-00001"}, &rev); err != nil {
			return false, "Revision: " + err.Error()
		}
		var d appsv1.Deployment
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "web-00001-deployment"}, &d); err != nil {
			return false, "Deployment: " + err.Error()
		}
		var rt servingv1alpha1.Route
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "web"}, &rt); err != nil {
			return false, "Route: " + err.Error()
		}
		var svc servingv1alpha1.Service
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "web"}, &svc); err != nil {
			return false, "Service: " + err.Error()
		}
		if len(svc.Status.Conditions) == 0 || len(rev.Status.Conditions) == 0 || len(rt.Status.Conditions) == 0 {
			return false, "no status conditions yet"
		}
		return true, ""
	})
	var got v1alpha1.PodAutoscaler
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "hello"}, &got); err != nil || len(got.Status.Conditions) == 0 {
		t.Errorf("PodAutoscaler status %+v, %v: want conditions written", got.Status, err)
	}
	log, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(log)), "forbidden") {
		t.Errorf("the controller was refused something under the chart's RBAC:\n%s", log)
	}
}
