package kpa

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// errNotOwned: a ServerlessService or HorizontalPodAutoscaler of the
// PodAutoscaler's name belongs to someone else.
var errNotOwned = errors.New("refusing to take it over")

// ensureSKS writes the target's ServerlessService (same name, owned by the
// PodAutoscaler) with the wanted mode and why, and returns it with its
// status.
func (r *PodAutoscaler) ensureSKS(ctx context.Context, pa *v1alpha1.PodAutoscaler, tgt *target, mode v1alpha1.Mode, why string, activators int32) (*v1alpha1.ServerlessService, error) {
	spec := v1alpha1.ServerlessServiceSpec{Mode: mode, ModeReason: why, NumActivators: activators, PublicService: pa.Spec.Service.Name, Port: pa.Spec.Service.Port,
		Selector: tgt.selector}
	sks := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name}}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(sks), sks)
	switch {
	case apierrors.IsNotFound(err):
		sks.Spec = spec
		if err := controllerutil.SetControllerReference(pa, sks, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := r.Client.Create(ctx, sks); err != nil {
			return nil, fmt.Errorf("create ServerlessService %s: %w", sks.Name, err)
		}
		return sks, nil
	case err != nil:
		return nil, err
	case !metav1.IsControlledBy(sks, pa):
		return nil, fmt.Errorf("ServerlessService %q exists and is not controlled by PodAutoscaler %q (delete it so sockscale can make its own): %w", sks.Name, pa.Name, errNotOwned)
	case equality.Semantic.DeepEqual(sks.Spec, spec):
		return sks, nil
	}
	sks.Spec = spec
	if err := r.Client.Update(ctx, sks); err != nil {
		return nil, fmt.Errorf("update ServerlessService %s: %w", sks.Name, err)
	}
	return sks, nil
}
