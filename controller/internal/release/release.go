package release

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
)

// Why a selector and not fresh slices: once sockscale is gone nobody
// would follow the pods, and slices written now go stale with the next
// rollout. With the target's selector (the one its private Service has)
// Kubernetes' own EndpointSlice controller lists the pods from then on: a
// Service in Serve mode keeps reaching them, and one at zero has no
// endpoints instead of gone activators. The annotation marks the selector
// as sockscale's, so a later install takes the Service over again (the
// ServerlessService reconciler removes that selector) while a selector a
// user set stays refused.

// Why the controller is stopped first: a running controller takes a
// handed-back Service over again (that is what makes a reinstall work), so
// the two would undo each other until helm deleted the controller. Scaled
// to zero replicas, it writes nothing more; the uninstall deletes its
// Deployment next anyway. (A failed uninstall leaves it at zero: `helm
// upgrade` or another `helm uninstall` settles it.)

// Result counts what a release changed.
type Result struct {
	// Services that got their target's selector back.
	Services int
	// EndpointSlices of sockscale's that were deleted.
	Slices int
}

// Options tune Release; zero values are the defaults.
type Options struct {
	// Passes is how many passes at most, Interval the pause between them
	// (default 5 and 1 s). A controller still running while the release
	// runs (a pre-delete hook runs before the chart's objects go) may
	// write a slice it decided on before a Service got its selector; a
	// later pass removes it. Release stops after the first pass that
	// changes nothing.
	Passes   int
	Interval time.Duration
	// Controller is the controller's Deployment, scaled to zero replicas
	// before anything is handed back; nil: not stopped.
	Controller *types.NamespacedName
	// StopTimeout bounds the wait for its pods to go (default 90 s); past
	// it the release goes on, and its passes undo what a controller still
	// stopping writes.
	StopTimeout time.Duration
}

// Release hands every ServerlessService's public Service back to
// Kubernetes: the target's selector (annotated sks.AnnotationHandedBack),
// and none of sockscale's EndpointSlices. ServerlessServices and
// PodAutoscalers stay (their CRDs are kept on uninstall).
func Release(ctx context.Context, c client.Client, opts Options) (Result, error) {
	if opts.Passes <= 0 {
		opts.Passes = 5
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 90 * time.Second
	}
	if opts.Controller != nil {
		if err := stopController(ctx, c, *opts.Controller, opts.StopTimeout, opts.Interval); err != nil {
			return Result{}, err
		}
	}
	var total Result
	for pass := 0; pass < opts.Passes; pass++ {
		if pass > 0 {
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(opts.Interval):
			}
		}
		res, err := releaseOnce(ctx, c)
		total.Services += res.Services
		total.Slices += res.Slices
		if err != nil {
			return total, err
		}
		if res == (Result{}) && pass > 0 {
			break
		}
	}
	return total, nil
}

func releaseOnce(ctx context.Context, c client.Client) (Result, error) {
	var list v1alpha1.ServerlessServiceList
	if err := c.List(ctx, &list); err != nil {
		return Result{}, fmt.Errorf("list ServerlessServices: %w", err)
	}
	var res Result
	for i := range list.Items {
		s := &list.Items[i]
		changed, err := restoreSelector(ctx, c, s)
		if err != nil {
			return res, err
		}
		if changed {
			res.Services++
		}
		n, err := deleteSlices(ctx, c, s.Namespace, s.Spec.PublicService)
		res.Slices += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// restoreSelector gives the public Service the target's selector, unless
// it has one (a user's, or one a previous pass set).
func restoreSelector(ctx context.Context, c client.Client, s *v1alpha1.ServerlessService) (bool, error) {
	if len(s.Spec.Selector) == 0 {
		return false, nil // the CRD requires one; nothing to restore
	}
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var svc corev1.Service
		if err := c.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.Spec.PublicService}, &svc); err != nil {
			return err
		}
		if len(svc.Spec.Selector) > 0 {
			return nil
		}
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			return nil // has no endpoints of its own
		}
		svc.Spec.Selector = s.Spec.Selector
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[sks.AnnotationHandedBack] = s.Name
		if err := c.Update(ctx, &svc); err != nil {
			return err
		}
		changed = true
		return nil
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("give Service %s/%s its target's selector: %w", s.Namespace, s.Spec.PublicService, err)
	}
	return changed, nil
}

// deleteSlices deletes sockscale's EndpointSlices of a public Service.
func deleteSlices(ctx context.Context, c client.Client, ns, service string) (int, error) {
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{
		discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: sks.ManagedBy,
	}); err != nil {
		return 0, fmt.Errorf("list EndpointSlices of %s/%s: %w", ns, service, err)
	}
	n := 0
	for i := range slices.Items {
		if err := c.Delete(ctx, &slices.Items[i]); client.IgnoreNotFound(err) != nil {
			return n, fmt.Errorf("delete EndpointSlice %s/%s: %w", ns, slices.Items[i].Name, err)
		}
		n++
	}
	return n, nil
}

// The release's own calls beyond the reconcilers' rules: it scales the
// controller's Deployment with a merge patch of /scale.
// +kubebuilder:rbac:groups=apps,resources=deployments/scale,verbs=patch

// stopController scales the controller's Deployment to zero and waits
// until it has no pods left, or timeout.
func stopController(ctx context.Context, c client.Client, ref types.NamespacedName, timeout, poll time.Duration) error {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	err := c.SubResource("scale").Patch(ctx, d, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`)))
	if apierrors.IsNotFound(err) {
		return nil // already gone: nothing to stop
	}
	if err != nil {
		return fmt.Errorf("scale the controller %s to zero: %w", ref, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		if err := c.Get(ctx, ref, d); err != nil {
			return client.IgnoreNotFound(err)
		}
		if d.Status.Replicas == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			log.FromContext(ctx).Info("the controller still has pods; handing the Services back anyway", "deployment", ref.String(), "replicas", d.Status.Replicas)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}
