package service

import (
	"testing"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

func TestMigrated(t *testing.T) {
	yes, no := true, false
	tr := func(rev string, latest bool) servingv1alpha1.TrafficTargetStatus {
		l := no
		if latest {
			l = yes
		}
		return servingv1alpha1.TrafficTargetStatus{RevisionName: rev, LatestRevision: &l}
	}
	for _, tt := range []struct {
		name    string
		traffic []servingv1alpha1.TrafficTargetStatus
		latest  string
		want    bool
	}{
		{"the latest target names it", []servingv1alpha1.TrafficTargetStatus{tr("hello-00002", true), tr("hello-00001", false)}, "hello-00002", true},
		{"a rollout's pieces name it", []servingv1alpha1.TrafficTargetStatus{tr("hello-00001", true), tr("hello-00002", true)}, "hello-00002", true},
		{"not yet", []servingv1alpha1.TrafficTargetStatus{tr("hello-00001", true)}, "hello-00002", false},
		{"only pinned targets", []servingv1alpha1.TrafficTargetStatus{tr("hello-00001", false)}, "hello-00002", true},
	} {
		if got := migrated(tt.traffic, tt.latest); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
