package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

func TestCollect(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	// rev is a Revision created `age` ago, reserve since `idle` ago.
	rev := func(name string, age, idle time.Duration, state servingv1alpha1.RoutingState, annotations ...string) servingv1alpha1.Revision {
		r := servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Status: servingv1alpha1.RevisionStatus{RoutingState: state, RoutingStateModified: &metav1.Time{Time: now.Add(-idle)}}}
		if len(annotations) == 2 {
			r.Annotations = map[string]string{annotations[0]: annotations[1]}
		}
		return r
	}
	reserve := servingv1alpha1.RoutingStateReserve
	svc := &servingv1alpha1.Service{Status: servingv1alpha1.ServiceStatus{LatestCreatedRevisionName: "hello-00009", LatestReadyRevisionName: "hello-00008"}}
	defaults := config.Defaults().GC
	tests := []struct {
		name     string
		gc       config.GC
		revs     []servingv1alpha1.Revision
		want     []string
		wantNext time.Duration // from now; 0: none
	}{
		{"the doc's example: min 2, max 3", config.GC{RetainSinceCreate: 48 * time.Hour, RetainSinceLastActive: 15 * time.Hour, MinNonActive: 2, MaxNonActive: 3}, []servingv1alpha1.Revision{
			rev("hello-00001", 100*time.Hour, 90*time.Hour, reserve), // 6th newest routed
			rev("hello-00002", 100*time.Hour, 20*time.Hour, reserve), // 5th, stale
			rev("hello-00003", 100*time.Hour, 16*time.Hour, reserve), // 4th, stale
			rev("hello-00004", 10*time.Hour, 5*time.Hour, reserve),   // 2nd, kept by min
			rev("hello-00005", 10*time.Hour, 1*time.Hour, reserve),   // newest, kept by min
			rev("hello-00006", 30*time.Hour, 10*time.Hour, reserve),  // 3rd, not stale (created 30h ago)
		}, []string{"hello-00003", "hello-00002", "hello-00001"}, 18 * time.Hour},
		{"never the latest, active, pending or no-gc", config.GC{RetainSinceCreate: 0, RetainSinceLastActive: 0, MinNonActive: 0, MaxNonActive: 1000}, []servingv1alpha1.Revision{
			rev("hello-00009", 100*time.Hour, 90*time.Hour, reserve),
			rev("hello-00008", 100*time.Hour, 90*time.Hour, reserve),
			rev("hello-00007", 100*time.Hour, 90*time.Hour, servingv1alpha1.RoutingStateActive),
			rev("hello-00006", 100*time.Hour, 90*time.Hour, servingv1alpha1.RoutingStatePending),
			rev("hello-00005", 100*time.Hour, 90*time.Hour, reserve, servingv1alpha1.NoGCAnnotation, "true"),
			rev("hello-00004", 100*time.Hour, 90*time.Hour, reserve),
		}, []string{"hello-00004"}, 0},
		{"defaults: the 20 newest routed stay, older stale ones go", defaults, func() []servingv1alpha1.Revision {
			var out []servingv1alpha1.Revision
			for i := range 25 {
				out = append(out, rev(fmt.Sprintf("hello-%05d", i+1), 1000*time.Hour, time.Duration(125-i)*time.Hour, reserve))
			}
			return out
		}(), []string{"hello-00003", "hello-00002", "hello-00001"}, 0}, // 23 candidates: -00008 and -00009 are the latest
		{"both time limits disabled: only max", config.GC{RetainSinceCreate: config.Disabled, RetainSinceLastActive: config.Disabled, MinNonActive: 1, MaxNonActive: 2}, []servingv1alpha1.Revision{
			rev("hello-00001", 1000*time.Hour, 300*time.Hour, reserve),
			rev("hello-00002", 1000*time.Hour, 200*time.Hour, reserve),
			rev("hello-00003", 1000*time.Hour, 100*time.Hour, reserve),
		}, []string{"hello-00001"}, 0},
		{"max disabled", config.GC{RetainSinceCreate: 48 * time.Hour, RetainSinceLastActive: config.Disabled, MinNonActive: 0, MaxNonActive: config.Disabled}, []servingv1alpha1.Revision{
			rev("hello-00001", 50*time.Hour, 1*time.Hour, reserve),
			rev("hello-00002", 40*time.Hour, 1*time.Hour, reserve),
		}, []string{"hello-00001"}, 8 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, next := Collect(svc, tt.revs, tt.gc, now)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("deleted (-want +got):\n%s", diff)
			}
			var gotNext time.Duration
			if !next.IsZero() {
				gotNext = next.Sub(now)
			}
			if gotNext != tt.wantNext {
				t.Errorf("next look in %s, want %s", gotNext, tt.wantNext)
			}
		})
	}
}
