package sks

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/socketlayer"
)

// writeStatus writes status if it changed (a conflict is left to the next
// reconcile).
func (r *ServerlessService) writeStatus(ctx context.Context, sks *v1alpha1.ServerlessService, status *v1alpha1.ServerlessServiceStatus) error {
	if equality.Semantic.DeepEqual(&sks.Status, status) {
		return nil
	}
	sks.Status = *status
	if err := r.Client.Status().Update(ctx, sks); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of ServerlessService %s: %w", sks.Name, err)
	}
	return nil
}

func setSKSCondition(s *v1alpha1.ServerlessServiceStatus, gen int64, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: names.ConditionReady, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// setSocketLayer sets the SocketLayer condition from the agents' node
// states (see package socketlayer); public is nil when the public Service
// does not exist. Without a tracker, or one too fresh to know, the
// condition is left as it is. acts are the ready activators (nil before
// they are read): where none has an address of one of the Service's
// families, the agents skip that family (no_activator_of_family), so the
// condition is False whatever the nodes say.
func (r *ServerlessService) setSocketLayer(s *v1alpha1.ServerlessServiceStatus, sks *v1alpha1.ServerlessService, public *corev1.Service, acts []endpoints.Endpoint) {
	if r.SocketLayer == nil {
		return
	}
	st, reason, msg, ok := socketlayer.Condition(r.SocketLayer.Summary(), public, sks.Spec.Port)
	if !ok {
		return
	}
	if family, missing := familyWithoutActivator(public, acts); missing && reason != socketlayer.ReasonNotRedirectable {
		st, reason = metav1.ConditionFalse, socketlayer.ReasonNoActivatorOfFamily
		msg = fmt.Sprintf("no ready activator has an %s address: the agents redirect none of the Service's %s connects, and in Proxy mode its %s clients find no endpoint (the activators' pods need addresses of every family the Service has)", family, family, family)
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: socketlayer.ConditionType, Status: st, Reason: reason, Message: msg, ObservedGeneration: sks.Generation})
}

// familyWithoutActivator is a family of public (IPv4 or IPv6) that none
// of acts has an address of; false when there is none, or no activator
// at all (the Ready condition says that).
func familyWithoutActivator(public *corev1.Service, acts []endpoints.Endpoint) (discoveryv1.AddressType, bool) {
	if public == nil || len(acts) == 0 {
		return "", false
	}
	for _, family := range endpoints.Families(public) {
		if !slices.ContainsFunc(acts, func(a endpoints.Endpoint) bool { _, ok := a.AddrOf(family); return ok }) {
			return family, true
		}
	}
	return "", false
}
