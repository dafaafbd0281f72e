package route

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

func TestResolve(t *testing.T) {
	revisions := map[string]*servingv1alpha1.Revision{"hello-00001": {}, "hello-00002": {}, "other-00001": {}}
	services := map[string]*servingv1alpha1.Service{
		"hello": {Status: servingv1alpha1.ServiceStatus{LatestReadyRevisionName: "hello-00002"}},
		"new":   {},
		"ahead": {Status: servingv1alpha1.ServiceStatus{LatestReadyRevisionName: "ahead-00001"}},
	}
	pct := func(v int64) *int64 { return &v }
	tests := []struct {
		name       string
		traffic    []servingv1alpha1.TrafficTarget
		want       []servingv1alpha1.TrafficTargetStatus
		wantReason string
		wantStatus metav1.ConditionStatus
	}{
		{"latest and pinned with a tag", []servingv1alpha1.TrafficTarget{
			{ConfigurationName: "hello", Percent: pct(55)},
			{RevisionName: "hello-00001", Percent: pct(45), Tag: "old"},
			{ConfigurationName: "hello", Tag: "latest"},
		}, []servingv1alpha1.TrafficTargetStatus{
			{ConfigurationName: "hello", RevisionName: "hello-00002", LatestRevision: ptr.To(true), Percent: pct(55)},
			{RevisionName: "hello-00001", LatestRevision: ptr.To(false), Percent: pct(45), Tag: "old"},
			{ConfigurationName: "hello", RevisionName: "hello-00002", LatestRevision: ptr.To(true), Tag: "latest"},
		}, "", ""},
		{"another Service's revision", []servingv1alpha1.TrafficTarget{{RevisionName: "other-00001", Percent: pct(100)}},
			[]servingv1alpha1.TrafficTargetStatus{{RevisionName: "other-00001", LatestRevision: ptr.To(false), Percent: pct(100)}}, "", ""},
		{"missing revision", []servingv1alpha1.TrafficTarget{{ConfigurationName: "hello", Percent: pct(50)}, {RevisionName: "hello-00009", Percent: pct(50)}},
			nil, ReasonRevisionMissing, metav1.ConditionFalse},
		{"missing Service", []servingv1alpha1.TrafficTarget{{ConfigurationName: "nope", Percent: pct(100)}}, nil, ReasonConfigurationMissing, metav1.ConditionFalse},
		{"Service without a ready revision", []servingv1alpha1.TrafficTarget{{ConfigurationName: "new", Percent: pct(100)}}, nil, ReasonNoReadyRevision, metav1.ConditionUnknown},
		{"Service ahead of the cache", []servingv1alpha1.TrafficTarget{{ConfigurationName: "ahead", Percent: pct(100)}}, nil, ReasonRevisionMissing, metav1.ConditionUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, p := Resolve(tt.traffic, revisions, services)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("split (-want +got):\n%s", diff)
			}
			switch {
			case tt.wantReason == "" && p != nil:
				t.Errorf("unexpected problem %v", p)
			case tt.wantReason != "" && (p == nil || p.reason != tt.wantReason || p.status != tt.wantStatus):
				t.Errorf("problem %v, want %s %s", p, tt.wantStatus, tt.wantReason)
			}
		})
	}
}

func TestTagAddresses(t *testing.T) {
	traffic := []servingv1alpha1.TrafficTargetStatus{{Tag: "b"}, {}, {Tag: "a"}, {Tag: "b"}}
	if diff := cmp.Diff([]string{"b", "a"}, tags(traffic)); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	if got := AddressName("hello", ""); got != "hello" {
		t.Errorf("own address %q", got)
	}
	if got := AddressName("hello", "canary"); got != "canary-hello" {
		t.Errorf("tag address %q", got)
	}
	long := "a-tag-long-enough-that-with-the-route-name-it-no-longer-fits"
	p := tooLong("hello-world", []string{"ok", long})
	if p == nil || p.reason != ReasonTagAddressTooLong || p.status != metav1.ConditionFalse {
		t.Fatalf("a %d-character address: %v", len(AddressName("hello-world", long)), p)
	}
	if tooLong("hello", []string{"ok"}) != nil {
		t.Error("a short tag refused")
	}
}

// TestWeights: a Route's own address takes every target with a percent,
// summed per revision; a tag's its entries by percent, or the newest at 0 %.
func TestWeights(t *testing.T) {
	p := func(v int64) *int64 { return &v }
	traffic := []servingv1alpha1.TrafficTargetStatus{
		{RevisionName: "r1", Percent: p(36), Tag: "latest"},
		{RevisionName: "r2", Percent: p(19), Tag: "latest"},
		{RevisionName: "r1", Percent: p(45)},
		{RevisionName: "r1", Tag: "old"},
		{RevisionName: "r3", Percent: p(0), Tag: "old"},
	}
	type result struct {
		Revisions []string
		Weights   map[string]int64
	}
	for _, tt := range []struct {
		tag  string
		want result
	}{
		{"", result{[]string{"r1", "r2"}, map[string]int64{"r1": 81, "r2": 19}}},
		{"latest", result{[]string{"r1", "r2"}, map[string]int64{"r1": 36, "r2": 19}}},
		{"old", result{[]string{"r3"}, map[string]int64{"r3": 1}}},
		{"none", result{nil, map[string]int64{}}},
	} {
		revs, w := Weights(traffic, tt.tag)
		if diff := cmp.Diff(tt.want, result{revs, w}); diff != "" {
			t.Errorf("tag %q (-want +got):\n%s", tt.tag, diff)
		}
	}
	if got := Summary(traffic); got != "r1=81%,r2=19%" {
		t.Errorf("Summary = %q", got)
	}
}
