package service

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

func template(image string) *servingv1alpha1.RevisionTemplateSpec {
	return &servingv1alpha1.RevisionTemplateSpec{Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: image}}}}
}

func TestTemplateHash(t *testing.T) {
	hash := func(tm *servingv1alpha1.RevisionTemplateSpec) string {
		t.Helper()
		h, err := TemplateHash(tm)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	v1 := hash(template("hello:v1"))
	if len(v1) != 16 || hash(template("hello:v1")) != v1 {
		t.Fatalf("hash %q: want 16 hex digits, the same for the same template", v1)
	}
	annotated := template("hello:v1")
	annotated.Metadata.Annotations = map[string]string{"autoscaling.knative.dev/target": "5", "a": "b"}
	reordered := template("hello:v1")
	reordered.Metadata.Annotations = map[string]string{"a": "b", "autoscaling.knative.dev/target": "5"}
	named := template("hello:v1")
	named.Metadata.Name = "hello-v1"
	for name, h := range map[string]string{"image": hash(template("hello:v2")), "annotation": hash(annotated), "name": hash(named)} {
		if h == v1 {
			t.Errorf("a changed %s kept the hash", name)
		}
	}
	if hash(annotated) != hash(reordered) {
		t.Error("the hash depends on map order")
	}
}

func TestNextName(t *testing.T) {
	tests := []struct {
		existing []string
		want     string
	}{
		{nil, "hello-00001"},
		{[]string{"hello-00001"}, "hello-00002"},
		// A hand-made or BYO-named Revision: the highest number counts,
		// other names and other Services' Revisions do not.
		{[]string{"hello-00001", "hello-00007", "hello-v2", "hello-world-00009", "other-00042"}, "hello-00008"},
		{[]string{"hello-99999"}, "hello-100000"},
	}
	for _, tt := range tests {
		if got := NextName("hello", tt.existing); got != tt.want {
			t.Errorf("NextName(hello, %v) = %s, want %s", tt.existing, got, tt.want)
		}
	}
}

func TestMakeRevision(t *testing.T) {
	svc := &servingv1alpha1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.ServiceSpec{Template: *template("hello:v1")}}
	svc.Spec.Template.Metadata.Labels = map[string]string{"team": "a", servingv1alpha1.ServiceLabelKey: "spoofed"}
	svc.Spec.Template.Metadata.Annotations = map[string]string{"autoscaling.knative.dev/min-scale": "1"}
	rev := MakeRevision(svc, "hello-00001", "0123456789abcdef")
	want := &servingv1alpha1.Revision{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001",
			Labels:      map[string]string{"team": "a", servingv1alpha1.ServiceLabelKey: "hello"},
			Annotations: map[string]string{"autoscaling.knative.dev/min-scale": "1", TemplateHashAnnotation: "0123456789abcdef"}},
		Spec: svc.Spec.Template.Spec,
	}
	if diff := cmp.Diff(want, rev); diff != "" {
		t.Errorf("Revision (-want +got):\n%s", diff)
	}
	if svc.Spec.Template.Metadata.Labels[servingv1alpha1.ServiceLabelKey] != "spoofed" {
		t.Error("MakeRevision changed the Service's template")
	}
}

func TestNewestReady(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	r := func(name string, created time.Time, st metav1.ConditionStatus) servingv1alpha1.Revision {
		rev := servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		meta.SetStatusCondition(&rev.Status.Conditions, metav1.Condition{Type: names.ConditionReady, Status: st, Reason: "x"})
		return rev
	}
	tests := []struct {
		name string
		revs []servingv1alpha1.Revision
		want string
	}{
		{"none", nil, ""},
		{"none ready", []servingv1alpha1.Revision{r("hello-00001", t0, metav1.ConditionUnknown)}, ""},
		{"the newest is not ready yet", []servingv1alpha1.Revision{
			r("hello-00002", t0.Add(time.Minute), metav1.ConditionUnknown), r("hello-00001", t0, metav1.ConditionTrue)}, "hello-00001"},
		{"the newest ready", []servingv1alpha1.Revision{
			r("hello-00001", t0, metav1.ConditionTrue), r("hello-00003", t0.Add(2*time.Minute), metav1.ConditionFalse), r("hello-00002", t0.Add(time.Minute), metav1.ConditionTrue)}, "hello-00002"},
		// Created in the same second: the name decides, by number.
		{"same second", []servingv1alpha1.Revision{r("hello-00010", t0, metav1.ConditionTrue), r("hello-00009", t0, metav1.ConditionTrue)}, "hello-00010"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newestReady(tt.revs); got != tt.want {
				t.Errorf("newestReady = %q, want %q", got, tt.want)
			}
		})
	}
}
