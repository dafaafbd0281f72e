package scaletarget

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

func TestParseKinds(t *testing.T) {
	rollout := schema.GroupKind{Group: "argoproj.io", Kind: "Rollout"}
	rc := schema.GroupKind{Kind: "ReplicationController"}
	tests := []struct {
		in      string
		want    Kinds
		wantErr string
	}{
		{"Deployment.apps,StatefulSet.apps", Kinds{Deployment, StatefulSet}, ""},
		{" Deployment.apps , Rollout.argoproj.io", Kinds{Deployment, rollout}, ""},
		{"ReplicationController", Kinds{rc}, ""},
		{"Deployment.apps,Deployment.apps", Kinds{Deployment}, ""},
		{"", nil, `scale target kind "": want Kind.group`},
		{"Deployment.apps,", nil, `scale target kind "": want Kind.group`},
		{"deployments.apps", nil, `scale target kind "deployments.apps": want Kind.group`},
		{"Rollout.Argo_Proj", nil, `scale target kind "Rollout.Argo_Proj": group "Argo_Proj" is not a DNS subdomain`},
	}
	for _, tt := range tests {
		got, err := ParseKinds(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseKinds(%q): err %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseKinds(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseKinds(%q) (-want +got):\n%s", tt.in, diff)
		}
		if again, err := ParseKinds(got.String()); err != nil || !cmp.Equal(got, again) {
			t.Errorf("ParseKinds(%q).String() = %q does not parse back: %v, %v", tt.in, got.String(), again, err)
		}
	}
}

// TestAllows: nil Kinds are the defaults, Deployments and StatefulSets;
// the group counts, the version does not.
func TestAllows(t *testing.T) {
	rollout := schema.GroupKind{Group: "argoproj.io", Kind: "Rollout"}
	tests := []struct {
		kinds Kinds
		gk    schema.GroupKind
		want  bool
	}{
		{nil, Deployment, true},
		{nil, StatefulSet, true},
		{nil, rollout, false},
		{nil, schema.GroupKind{Group: "example.com", Kind: "Deployment"}, false},
		{Kinds{Deployment, rollout}, rollout, true},
		{Kinds{Deployment, rollout}, StatefulSet, false},
	}
	for _, tt := range tests {
		if got := tt.kinds.Allows(tt.gk); got != tt.want {
			t.Errorf("%s allows %s: %v, want %v", tt.kinds, tt.gk, got, tt.want)
		}
	}
}

func TestGroupVersionKind(t *testing.T) {
	tests := []struct {
		ref     v1alpha1.ScaleTargetRef
		want    schema.GroupVersionKind
		wantErr string
	}{
		{v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "StatefulSet"}, schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}, ""},
		{v1alpha1.ScaleTargetRef{APIVersion: "v1", Kind: "ReplicationController"}, schema.GroupVersionKind{Version: "v1", Kind: "ReplicationController"}, ""},
		{v1alpha1.ScaleTargetRef{APIVersion: "argoproj.io/v1alpha1", Kind: "Rollout"}, schema.GroupVersionKind{Group: "argoproj.io", Version: "v1alpha1", Kind: "Rollout"}, ""},
		{v1alpha1.ScaleTargetRef{APIVersion: "apps/v1/extra", Kind: "Deployment"}, schema.GroupVersionKind{}, `scaleTargetRef.apiVersion "apps/v1/extra": want group/version`},
		{v1alpha1.ScaleTargetRef{APIVersion: "", Kind: "Deployment"}, schema.GroupVersionKind{}, `scaleTargetRef.apiVersion "": want group/version`},
		{v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "deployment"}, schema.GroupVersionKind{}, `scaleTargetRef.kind "deployment": want a kind`},
	}
	for _, tt := range tests {
		got, err := GroupVersionKind(tt.ref)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: err %v, want one containing %q", tt.ref, err, tt.wantErr)
			}
			continue
		}
		if diff := cmp.Diff(tt.want, got); err != nil || diff != "" {
			t.Errorf("%+v: err %v (-want +got):\n%s", tt.ref, err, diff)
		}
	}
}

// TestSelector: a /scale's selector must be a label set, which the
// private Service can select by.
func TestSelector(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"app=web", map[string]string{"app": "web"}, ""},
		{"app=web,tier=front", map[string]string{"app": "web", "tier": "front"}, ""},
		{"app==web", map[string]string{"app": "web"}, ""},
		{"", nil, "reports no status.selector"},
		{"app!=web", nil, `its /scale selector "app!=web" is not equality only (want a=b,c=d)`},
		{"app in (web)", nil, `its /scale selector "app in (web)" is not equality only`},
		{"app", nil, `its /scale selector "app" is not equality only`},
		{"app=web,!canary", nil, `its /scale selector "app=web,!canary" is not equality only`},
		{"app=web,app=api", nil, `wants label app to be both "web" and "api"`},
		{"app=(", nil, `its /scale selector "app=("`},
	}
	for _, tt := range tests {
		got, err := Selector(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Selector(%q): %v, err %v, want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if diff := cmp.Diff(tt.want, got); err != nil || diff != "" {
			t.Errorf("Selector(%q): err %v (-want +got):\n%s", tt.in, err, diff)
		}
	}
}
