package revision

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TestRevisionRefusesForeignObjects: a public Service or PodAutoscaler of
// the Revision's names made by someone else is left as it is, and Ready
// says which.
func TestRevisionRefusesForeignObjects(t *testing.T) {
	tests := []struct {
		name    string
		foreign client.Object
		wantMsg string
	}{
		{"public Service", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "mine"}}}, `Service "hello-00001" exists and is not controlled by Revision "hello-00001"`},
		{"PodAutoscaler", &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001"},
			Spec: v1alpha1.PodAutoscalerSpec{ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "mine"}}},
			`PodAutoscaler "hello-00001" exists and is not controlled by Revision "hello-00001"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, servingv1alpha1.AddToScheme} {
				if err := add(scheme); err != nil {
					t.Fatal(err)
				}
			}
			r := rev("hello-00001").Obj()
			r.UID = "rev-uid"
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&servingv1alpha1.Revision{}).WithObjects(r, tt.foreign).Build()
			ctx := context.Background()
			rec := &Reconciler{Client: c}
			if _, err := rec.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello-00001"}}); err != nil {
				t.Fatal(err)
			}
			var got servingv1alpha1.Revision
			if err := c.Get(ctx, client.ObjectKeyFromObject(r), &got); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != names.ReasonNotOwned || !strings.Contains(cond.Message, tt.wantMsg) {
				t.Errorf("Ready = %+v, want False %s naming %s", cond, names.ReasonNotOwned, tt.wantMsg)
			}
			after := tt.foreign.DeepCopyObject().(client.Object)
			if err := c.Get(ctx, client.ObjectKeyFromObject(tt.foreign), after); err != nil {
				t.Fatal(err)
			}
			if len(after.GetOwnerReferences()) != 0 || after.GetResourceVersion() != tt.foreign.GetResourceVersion() {
				t.Errorf("the foreign %s was changed: owners %v, resourceVersion %s -> %s", tt.name, after.GetOwnerReferences(), tt.foreign.GetResourceVersion(), after.GetResourceVersion())
			}
			// The Deployment, made before the refused object, is the
			// Revision's.
			var d appsv1.Deployment
			if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "hello-00001-deployment"}, &d); err != nil || !metav1.IsControlledBy(&d, r) {
				t.Errorf("Deployment: %v, owners %v", err, d.OwnerReferences)
			}
		})
	}
}
