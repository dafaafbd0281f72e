package release

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
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
// Deployment next anyway. A release that fails scales it back (helm then
// stops the uninstall, and the controller must keep serving, taking back
// what was handed back so far): the replicas it had are kept in
// AnnotationReplicas, so a retry of the Job, which finds it at zero,
// still knows them.

// Why only Services sockscale managed: a ServerlessService names its
// public Service, and whoever can create one (or its PodAutoscaler) can
// name any Service of the namespace, such as one whose endpoints a user
// writes by hand. The reconciler refuses to write beside those, so they
// carry none of its slices; a selector given to them at uninstall would
// replace the user's endpoints. Proof is what only the reconciler leaves:
// an EndpointSlice of the Service labelled as sockscale's and controlled
// by the ServerlessService, or (a target without pods or activators has
// no slice) its Ready condition NoEndpoints, set once it wrote them.

// AnnotationReplicas on the controller's Deployment holds its replicas
// before a release scaled it to zero.
const AnnotationReplicas = "sockscale.dev/replicas-before-release"

// Result counts what a release changed.
type Result struct {
	// Services that got their target's selector back.
	Services int
	// EndpointSlices of sockscale's that were deleted.
	Slices int
	// Skipped public Services had no selector and no sign that sockscale
	// wrote their endpoints: left as they are.
	Skipped int
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
	// before anything is handed back, and back to its replicas if the
	// release fails; nil: not stopped.
	Controller *types.NamespacedName
	// StopTimeout bounds the wait for its pods to go (default 90 s); past
	// it the release goes on, and its passes undo what a controller still
	// stopping writes.
	StopTimeout time.Duration
}

// Release hands every public Service that sockscale managed back to
// Kubernetes: the target's selector (annotated sks.AnnotationHandedBack),
// and none of sockscale's EndpointSlices. ServerlessServices and
// PodAutoscalers stay (their CRDs are kept on uninstall). If it fails
// after stopping the controller, it starts it again.
func Release(ctx context.Context, c client.Client, opts Options) (_ Result, err error) {
	if opts.Passes <= 0 {
		opts.Passes = 5
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 90 * time.Second
	}
	// What fails for want of the CRD or a permission fails here, before
	// the controller is stopped.
	if err := c.List(ctx, &v1alpha1.ServerlessServiceList{}, client.Limit(1)); err != nil {
		return Result{}, fmt.Errorf("list ServerlessServices: %w", err)
	}
	if opts.Controller != nil {
		ref := *opts.Controller
		stopped, stopErr := stopController(ctx, c, ref, opts.StopTimeout, opts.Interval)
		if stopped {
			defer func() {
				if err != nil {
					err = errors.Join(err, startAgain(ctx, c, ref))
				}
			}()
		}
		if stopErr != nil {
			return Result{}, stopErr
		}
	}
	var total Result
	skipped := map[types.NamespacedName]bool{}
	for pass := 0; pass < opts.Passes; pass++ {
		if pass > 0 {
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(opts.Interval):
			}
		}
		res, err := releaseOnce(ctx, c, skipped)
		total.Services += res.Services
		total.Slices += res.Slices
		total.Skipped = len(skipped)
		if err != nil {
			return total, err
		}
		if res.Services == 0 && res.Slices == 0 && pass > 0 {
			break
		}
	}
	return total, nil
}

// releaseOnce is one pass over the ServerlessServices; skipped gathers
// the public Services left for want of proof (each logged once).
func releaseOnce(ctx context.Context, c client.Client, skipped map[types.NamespacedName]bool) (Result, error) {
	var list v1alpha1.ServerlessServiceList
	if err := c.List(ctx, &list); err != nil {
		return Result{}, fmt.Errorf("list ServerlessServices: %w", err)
	}
	var res Result
	for i := range list.Items {
		s := &list.Items[i]
		own, err := ownSlices(ctx, c, s)
		if err != nil {
			return res, err
		}
		changed, err := restoreSelector(ctx, c, s, len(own) > 0 || wroteNoEndpoints(s), skipped)
		if err != nil {
			return res, err
		}
		if changed {
			res.Services++
		}
		// Deleted whatever became of the Service: they are sockscale's,
		// and nothing follows the pods for them once it is gone.
		n, err := deleteSlices(ctx, c, own)
		res.Slices += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// ownSlices are the EndpointSlices of s's public Service that its
// reconciler wrote: labelled as sockscale's (anyone may set a label) and
// controlled by s.
func ownSlices(ctx context.Context, c client.Client, s *v1alpha1.ServerlessService) ([]discoveryv1.EndpointSlice, error) {
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace(s.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: s.Spec.PublicService, discoveryv1.LabelManagedBy: sks.ManagedBy,
	}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", s.Namespace, s.Spec.PublicService, err)
	}
	var own []discoveryv1.EndpointSlice
	for i := range slices.Items {
		if metav1.IsControlledBy(&slices.Items[i], s) {
			own = append(own, slices.Items[i])
		}
	}
	return own, nil
}

// wroteNoEndpoints tells whether s's reconciler last wrote its public
// Service's endpoints as none (a target without ready pods or
// activators): it says NoEndpoints only once it owns them.
func wroteNoEndpoints(s *v1alpha1.ServerlessService) bool {
	cond := meta.FindStatusCondition(s.Status.Conditions, names.ConditionReady)
	return cond != nil && cond.Reason == sks.ReasonNoEndpoints
}

// restoreSelector gives the public Service the target's selector, unless
// it has one (a user's, or one a previous pass set) or sockscale did not
// manage it (managed false: recorded in skipped).
func restoreSelector(ctx context.Context, c client.Client, s *v1alpha1.ServerlessService, managed bool, skipped map[types.NamespacedName]bool) (bool, error) {
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
		if !managed {
			key := client.ObjectKeyFromObject(&svc)
			if !skipped[key] {
				skipped[key] = true
				log.FromContext(ctx).Info("left a public Service as it is: sockscale shows no sign of having written its endpoints (no EndpointSlice of its ServerlessService)",
					"service", key.String(), "serverlessService", s.Name)
			}
			return nil
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

// deleteSlices deletes the given EndpointSlices (ownSlices').
func deleteSlices(ctx context.Context, c client.Client, slices []discoveryv1.EndpointSlice) (int, error) {
	n := 0
	for i := range slices {
		if err := c.Delete(ctx, &slices[i]); client.IgnoreNotFound(err) != nil {
			return n, fmt.Errorf("delete EndpointSlice %s/%s: %w", slices[i].Namespace, slices[i].Name, err)
		}
		n++
	}
	return n, nil
}

// The release's own calls beyond the reconcilers' rules: it scales the
// controller's Deployment through an update, which records the replicas
// in the same write.
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;update

// stopController scales the controller's Deployment to zero, its replicas
// kept in AnnotationReplicas, and waits until it has no pods left, or
// timeout. stopped says that it was scaled (startAgain undoes it), even
// when err is the wait's.
func stopController(ctx context.Context, c client.Client, ref types.NamespacedName, timeout, poll time.Duration) (stopped bool, err error) {
	d := &appsv1.Deployment{}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, ref, d); err != nil {
			return err
		}
		if _, ok := d.Annotations[AnnotationReplicas]; !ok {
			// Not yet stopped by a release; one that was (a Job retried
			// after it was killed) left the count to restore.
			if d.Annotations == nil {
				d.Annotations = map[string]string{}
			}
			d.Annotations[AnnotationReplicas] = strconv.FormatInt(int64(ptr.Deref(d.Spec.Replicas, 1)), 10)
		}
		d.Spec.Replicas = ptr.To(int32(0))
		return c.Update(ctx, d)
	})
	if apierrors.IsNotFound(err) {
		return false, nil // already gone: nothing to stop
	}
	if err != nil {
		return false, fmt.Errorf("scale the controller %s to zero: %w", ref, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		if err := c.Get(ctx, ref, d); err != nil {
			return true, client.IgnoreNotFound(err)
		}
		if d.Status.Replicas == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			log.FromContext(ctx).Info("the controller still has pods; handing the Services back anyway", "deployment", ref.String(), "replicas", d.Status.Replicas)
			return true, nil
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// startAgain gives the controller's Deployment back the replicas
// stopController recorded. It runs on a failed release, often because ctx
// ended (the Job's deadline), so it has its own, within the pod's grace
// period (the chart's Job: 30 s).
func startAgain(ctx context.Context, c client.Client, ref types.NamespacedName) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	var replicas int32
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, ref, d); err != nil {
			return err
		}
		v, ok := d.Annotations[AnnotationReplicas]
		if !ok {
			return nil // someone scaled it since; theirs to keep
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return fmt.Errorf("annotation %s=%q is not a replica count", AnnotationReplicas, v)
		}
		replicas = int32(n)
		d.Spec.Replicas = ptr.To(replicas)
		delete(d.Annotations, AnnotationReplicas)
		return c.Update(ctx, d)
	})
	if err != nil {
		return fmt.Errorf("scale the controller %s back up after the failed release: %w", ref, err)
	}
	log.FromContext(ctx).Info("the release failed: scaled the controller back up", "deployment", ref.String(), "replicas", replicas)
	return nil
}
