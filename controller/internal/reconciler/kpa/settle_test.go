package kpa

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TestSettle: the stable and panic values are written when they moved by
// more than 5 % (or to or from 0), or along with any other change; else
// the status stays as it is and costs no write.
func TestSettle(t *testing.T) {
	st := func(stable, panicValue string, desired int32, msg string) *v1alpha1.PodAutoscalerStatus {
		return &v1alpha1.PodAutoscalerStatus{DesiredScale: ptr.To(desired), StableValue: stable, PanicValue: panicValue,
			Conditions: []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: "Scaled", Message: msg}}}
	}
	tests := []struct {
		name             string
		old, held, fresh *v1alpha1.PodAutoscalerStatus
		wantFresh        bool
	}{
		{"nothing moved", st("70.000", "70.000", 1, "1 pods for a stable concurrency of 70.000"),
			st("70.000", "70.000", 1, "1 pods for a stable concurrency of 70.000"), st("70.000", "70.000", 1, "1 pods for a stable concurrency of 70.000"), false},
		{"stable +3.6 % is held", st("70.000", "70.000", 1, "1 pods for a stable concurrency of 70.000"),
			st("70.000", "70.000", 1, "1 pods for a stable concurrency of 70.000"), st("72.500", "70.000", 1, "1 pods for a stable concurrency of 72.500"), false},
		{"stable -4.9 % is held", st("70.000", "70.000", 1, "m"), st("70.000", "70.000", 1, "m"), st("66.600", "70.000", 1, "m"), false},
		{"stable +5.1 % is written", st("70.000", "70.000", 1, "m"), st("70.000", "70.000", 1, "m"), st("73.600", "70.000", 1, "m"), true},
		{"panic -10 % is written", st("70.000", "70.000", 1, "m"), st("70.000", "70.000", 1, "m"), st("70.000", "63.000", 1, "m"), true},
		{"0 to non-zero is written", st("0.000", "0.000", 0, "m"), st("0.000", "0.000", 0, "m"), st("0.001", "0.000", 0, "m"), true},
		{"to 0 is written", st("0.010", "0.010", 1, "m"), st("0.010", "0.010", 1, "m"), st("0.000", "0.010", 1, "m"), true},
		{"no value shown yet", st("", "", -1, "m"), st("", "", -1, "m"), st("0.000", "0.000", -1, "m"), true},
		{"another field changed: the values come along", st("70.000", "70.000", 1, "m"), st("70.000", "70.000", 2, "m"), st("71.000", "70.500", 2, "m"), true},
		{"a condition changed: the values come along", st("70.000", "70.000", 1, "m"), st("70.000", "70.000", 1, "other"), st("71.000", "70.000", 1, "other"), true},
	}
	for _, tt := range tests {
		got := settle(tt.old, tt.held, tt.fresh, true)
		if want := map[bool]*v1alpha1.PodAutoscalerStatus{true: tt.fresh, false: tt.held}[tt.wantFresh]; got != want {
			t.Errorf("%s: got %+v, want the %s status", tt.name, *got, map[bool]string{true: "fresh", false: "held"}[tt.wantFresh])
		}
	}
}

// TestTickStatusMessageShowsTheWrittenValue: the Ready message is made
// from the value the status shows, so a drift that is not written does
// not change the message either (and costs no write).
func TestTickStatusMessageShowsTheWrittenValue(t *testing.T) {
	s, err := config.Effective(config.Defaults(), 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tick := func(old *v1alpha1.PodAutoscalerStatus, stable float64) *v1alpha1.PodAutoscalerStatus {
		o := outcome{dec: decider.Decision{Valid: true, DesiredScale: 1}, values: collector.Values{Stable: stable, Panic: stable, HasData: true},
			want: 1, ready: 1, initialized: true, reach: reach{ok: true, reason: ReasonReachable}, zero: zeroOutcome{pods: 1, active: true, reason: ReasonActive},
			sks: &v1alpha1.ServerlessService{Status: v1alpha1.ServerlessServiceStatus{Mode: v1alpha1.ModeServe}}}
		return tickStatus(old, old.DeepCopy(), 1, s, o, true)
	}
	first := tick(&v1alpha1.PodAutoscalerStatus{}, 70)
	ready := func(st *v1alpha1.PodAutoscalerStatus) string {
		return meta.FindStatusCondition(st.Conditions, names.ConditionReady).Message
	}
	if first.StableValue != "70.000" || ready(first) != "1 pods for a stable concurrency of 70.000" {
		t.Fatalf("first tick: stable %q, Ready %q", first.StableValue, ready(first))
	}
	if drift := tick(first, 72.5); !equality.Semantic.DeepEqual(first, drift) {
		t.Errorf("a +3.6 %% drift changed the status: stable %q, Ready %q", drift.StableValue, ready(drift))
	}
	if moved := tick(first, 74); moved.StableValue != "74.000" || ready(moved) != "1 pods for a stable concurrency of 74.000" {
		t.Errorf("a +5.7 %% move: stable %q, Ready %q", moved.StableValue, ready(moved))
	}
}

// TestMessagesRefreshInTime: between two refreshes a status whose only
// change is a condition's message (same status and reason) is not
// written; a new reason is written at once, and any write shows the
// messages of the moment.
func TestMessagesRefreshInTime(t *testing.T) {
	st := func(desired int32, reason, msg string) *v1alpha1.PodAutoscalerStatus {
		return &v1alpha1.PodAutoscalerStatus{DesiredScale: ptr.To(desired), StableValue: "70.000", PanicValue: "70.000",
			Conditions: []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: reason, Message: msg}}}
	}
	old := st(5, ReasonPartialStats, "no stats from 1 of the 5 ready pods")
	moreMissing := st(5, ReasonPartialStats, "no stats from 2 of the 5 ready pods")
	if got := settle(old, moreMissing, moreMissing, false); !equality.Semantic.DeepEqual(old, got) {
		t.Errorf("a message-only change before its refresh was written: %+v", got.Conditions)
	}
	if got := settle(old, moreMissing, moreMissing, true); got != moreMissing {
		t.Errorf("a message-only change at its refresh was not written: %+v", got.Conditions)
	}
	newReason := st(5, "Scaled", "5 pods for a stable concurrency of 70.000")
	if got := settle(old, newReason, newReason, false); got != newReason {
		t.Errorf("a new reason waited for the refresh: %+v", got.Conditions)
	}
	scaled := st(6, ReasonPartialStats, "no stats from 2 of the 5 ready pods")
	if got := settle(old, scaled, scaled, false); got != scaled {
		t.Errorf("a new desired scale did not bring the message of the moment: %+v", got)
	}
}
