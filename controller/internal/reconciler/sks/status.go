package sks

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
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
// condition is left as it is.
func (r *ServerlessService) setSocketLayer(s *v1alpha1.ServerlessServiceStatus, sks *v1alpha1.ServerlessService, public *corev1.Service) {
	if r.SocketLayer == nil {
		return
	}
	st, reason, msg, ok := socketlayer.Condition(r.SocketLayer.Summary(), public, sks.Spec.Port)
	if !ok {
		return
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: socketlayer.ConditionType, Status: st, Reason: reason, Message: msg, ObservedGeneration: sks.Generation})
}
