package cachetrim

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/testutil/workload"
)

func userDeployment(name string) *appsv1.Deployment { return workload.Deployment("shop", name) }

func userSlice(service string, n int) *discoveryv1.EndpointSlice {
	return workload.EndpointSlice("shop", service, n)
}

func revisionControlled(d *appsv1.Deployment, apiVersion string, controller bool) *appsv1.Deployment {
	d.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: "Revision", Name: "hello-00001", UID: "3c4d5e6f-7a8b-4c0d-9e1f-2a3b4c5d6e7f", Controller: ptr.To(controller)}}
	return d
}

// TestDeploymentKeepsWhatTheControllerReads: a Deployment sockscale does
// not control loses its pod template's spec and its annotations, and keeps
// what the reconcilers read: the settings it yields are the same.
func TestDeploymentKeepsWhatTheControllerReads(t *testing.T) {
	full := userDeployment("cart")
	out, err := Deployment(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*appsv1.Deployment)
	want := full.DeepCopy()
	want.ManagedFields, want.Annotations = nil, nil
	want.Spec.RevisionHistoryLimit = nil
	want.Spec.Template.Spec = corev1.PodSpec{}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimmed Deployment (-want +got):\n%s", diff)
	}
	pa := &v1alpha1.PodAutoscaler{Spec: v1alpha1.PodAutoscalerSpec{MaxScale: ptr.To[int32](9)}}
	fromFull, errFull := config.ForPodAutoscaler(config.Defaults(), pa, full)
	fromTrimmed, errTrimmed := config.ForPodAutoscaler(config.Defaults(), pa, got)
	if errFull != nil || errTrimmed != nil {
		t.Fatalf("settings: %v, %v", errFull, errTrimmed)
	}
	if diff := cmp.Diff(fromFull, fromTrimmed); diff != "" {
		t.Errorf("settings of the trimmed Deployment differ (-full +trimmed):\n%s", diff)
	}
}

// TestARevisionsDeploymentIsKeptWhole: the Revision reconciler compares
// and corrects the pod template of the Deployments it controls, so those
// keep it; an owner that is not the controller, or a Revision of another
// API group, does not count.
func TestARevisionsDeploymentIsKeptWhole(t *testing.T) {
	for _, tt := range []struct {
		name       string
		apiVersion string
		controller bool
		whole      bool
	}{
		{"controlled by a Revision", "serving.sockscale.dev/v1alpha1", true, true},
		{"controlled by a later version's Revision", "serving.sockscale.dev/v1", true, true},
		{"owned by a Revision, not controlled", "serving.sockscale.dev/v1alpha1", false, false},
		{"controlled by another group's Revision", "serving.knative.dev/v1", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := revisionControlled(userDeployment("cart"), tt.apiVersion, tt.controller)
			out, err := Deployment(d.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			got := out.(*appsv1.Deployment)
			if len(got.ManagedFields) != 0 {
				t.Error("managed fields kept")
			}
			if whole := len(got.Spec.Template.Spec.Containers) == 3 && got.Annotations != nil; whole != tt.whole {
				t.Errorf("kept whole: %v, want %v", whole, tt.whole)
			}
		})
	}
}

// TestEndpointSlicesSockscaleReadsAreKeptWhole: the slices sockscale
// writes and those of private Services keep their endpoints; any other
// keeps what the ServerlessService reconciler reads of a foreign slice on
// a public Service (name, labels, owner) and loses its endpoints.
func TestEndpointSlicesSockscaleReadsAreKeptWhole(t *testing.T) {
	for _, tt := range []struct {
		name   string
		labels map[string]string
		whole  bool
	}{
		{"written by sockscale", map[string]string{discoveryv1.LabelManagedBy: sks.ManagedBy}, true},
		{"of a private Service", map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", sks.LabelServerlessService: "hello"}, true},
		{"of any other Service", map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}, false},
		{"mirrored from an Endpoints object", map[string]string{discoveryv1.LabelManagedBy: "endpointslicemirroring-controller.k8s.io"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := userSlice("hello", 5)
			s.Labels = tt.labels
			s.Labels[discoveryv1.LabelServiceName] = "hello"
			out, err := EndpointSlice(s.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			want := s.DeepCopy()
			if !tt.whole {
				want.Endpoints, want.Annotations = nil, nil
			}
			if diff := cmp.Diff(want, out); diff != "" {
				t.Errorf("cached slice (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOtherObjectsPassThrough: what the informer hands over that is not
// the type a transform is for (a tombstone) comes out as it went in.
func TestOtherObjectsPassThrough(t *testing.T) {
	tomb := toolscache.DeletedFinalStateUnknown{Key: "shop/cart", Obj: userDeployment("cart")}
	for name, transform := range map[string]toolscache.TransformFunc{"Deployment": Deployment, "EndpointSlice": EndpointSlice} {
		out, err := transform(tomb)
		if err != nil || !cmp.Equal(out, tomb) {
			t.Errorf("%s transform of a tombstone: %v, %v", name, out, err)
		}
	}
}
