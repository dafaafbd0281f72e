package kpa

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// TestStatusWriterWritesTheLatest: statuses queued for one target before
// the writer gets to it are written once, the latest; a PodAutoscaler
// deleted meanwhile costs nothing but a dropped write; the writer stops
// with its context.
func TestStatusWriterWritesTheLatest(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"}}
	var updates atomic.Int32
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.PodAutoscaler{}).WithObjects(pa).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, o client.Object, opts ...client.SubResourceUpdateOption) error {
			updates.Add(1)
			return c.SubResource(sub).Update(ctx, o, opts...)
		}}).Build()
	var current v1alpha1.PodAutoscaler
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(pa), &current); err != nil {
		t.Fatal(err)
	}
	w := newStatusWriter(c, 2)
	for _, desired := range []int32{1, 2, 3} {
		next := current.DeepCopy()
		next.Status.DesiredScale = ptr.To(desired)
		w.write(next)
	}
	gone := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "deleted"}}
	w.write(gone)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- w.Start(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got v1alpha1.PodAutoscaler
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(pa), &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.DesiredScale != nil && *got.Status.DesiredScale == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status not written within 10 s: %+v", got.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not stop with its context")
	}
	if n := updates.Load(); n != 2 {
		t.Errorf("%d status updates, want 2: hello's latest only, and the deleted one's try", n)
	}
}
