package kpa

import (
	"context"
	"fmt"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
)

// decideExternal completes the tick of a target another autoscaler
// scales (the class external.autoscaling.sockscale.dev): the count is
// always the target's own, so sockscale never writes /scale for it,
// and the public Service leads to the pods whenever one is ready (the
// ServerlessService forces Proxy while none is: the activator holds
// requests at zero until that autoscaler, seeing them in the metrics
// APIs or KEDA's scaler, brings a pod). A leftover HPA of the HPA class
// goes.
func (r *PodAutoscaler) decideExternal(ctx context.Context, pa *v1alpha1.PodAutoscaler, tgt *target, o outcome) (outcome, error) {
	if err := r.removeHPA(ctx, pa); err != nil {
		return outcome{}, err
	}
	o.dec.Panicking = false
	o.want = o.current
	mode, why := endpoints.Wanted(o.current, 0, pa.Spec.ContainerConcurrency)
	var err error
	if o.sks, err = r.ensureSKS(ctx, pa, tgt, mode, why, o.dec.Activators); err != nil {
		return outcome{}, err
	}
	switch {
	case o.ready > 0:
		o.zero = zeroOutcome{o.current, true, ReasonActive, fmt.Sprintf("%d pods ready; their count is the target's own autoscaler's", o.ready)}
	case o.current > 0:
		o.zero = zeroOutcome{o.current, false, ReasonActivating, fmt.Sprintf("waiting for the first of %d pods to be ready", o.current)}
	default:
		o.zero = zeroOutcome{0, false, ReasonNoTraffic, "at zero: the activator holds requests until the target's own autoscaler (its HPA, KEDA) brings a pod"}
	}
	return o, nil
}
