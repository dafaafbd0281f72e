package chart_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// The controller's admission policies: rendered where the API server
// serves them (and enabled), matching only the controller's
// ServiceAccount of this release, the Deployments' one reading the
// release's autoscaler ConfigMap and denying when it is missing.
func TestControllerAdmissionPolicy(t *testing.T) {
	policies := []string{controllerName + "-deployments", controllerName + "-services", controllerName + "-autoscalers"}
	for _, tt := range []struct {
		name string
		args []string
		want bool
	}{
		{"an API server without ValidatingAdmissionPolicy", nil, false},
		{"an API server with it", vapAPI, true},
		{"disabled", append([]string{"--set", "controller.admissionPolicy.enabled=false"}, vapAPI...), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.args...)
			got := 0
			for _, o := range append(objs.ofKind("ValidatingAdmissionPolicy"), objs.ofKind("ValidatingAdmissionPolicyBinding")...) {
				if slices.Contains(policies, o.Name) {
					got++
				}
			}
			if (got == 6) != tt.want || (got != 0 && got != 6) {
				t.Errorf("%d policies and bindings, want them all: %v", got, tt.want)
			}
		})
	}

	objs := render(t, vapAPI...)
	for _, name := range policies {
		p := get[admissionv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", name)
		want := []admissionv1.MatchCondition{{Name: "the-controller", Expression: "request.userInfo.username == '" + controllerSA + "'"}}
		if diff := cmp.Diff(want, p.Spec.MatchConditions); diff != "" {
			t.Errorf("%s: matchConditions (-want +got):\n%s", name, diff)
		}
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: failurePolicy %v, want Fail", name, p.Spec.FailurePolicy)
		}
		b := get[admissionv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", name)
		if b.Spec.PolicyName != name || !cmp.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("binding %s: policy %q, actions %v", name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
	}
	b := get[admissionv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", policies[0])
	deny := admissionv1.DenyAction
	if diff := cmp.Diff(&admissionv1.ParamRef{Name: autoscalerCM, Namespace: namespace, ParameterNotFoundAction: &deny}, b.Spec.ParamRef); diff != "" {
		t.Errorf("the Deployments' paramRef (-want +got):\n%s", diff)
	}

	// Another release in another namespace checks its own controller.
	out, err := helm(t, append([]string{"template", "serving", chartDir(t), "--namespace", "knative-serving", "--set", "fullnameOverride=edge"}, vapAPI...)...)
	if err != nil {
		t.Fatal(err)
	}
	other, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	get[struct{}](t, other, "ServiceAccount", "edge-controller")
	if n := strings.Count(out, "request.userInfo.username == 'system:serviceaccount:knative-serving:edge-controller'"); n != len(policies) {
		t.Errorf("release serving in knative-serving: %d policies name its controller's ServiceAccount edge-controller, want %d", n, len(policies))
	}
}

// The PodAutoscalers' target policy: rendered where the API server serves
// it (and enabled), for every requester, with the kinds and resources of
// controller.scaleTargets.
func TestPodAutoscalerTargetPolicy(t *testing.T) {
	name := "sockscale-podautoscaler-targets"
	for _, tt := range []struct {
		name string
		args []string
		want int
	}{
		{"an API server without ValidatingAdmissionPolicy", nil, 0},
		{"an API server with it", vapAPI, 2},
		{"disabled", append([]string{"--set", "controller.scaleTargetPolicy.enabled=false"}, vapAPI...), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := 0
			objs := render(t, tt.args...)
			for _, o := range append(objs.ofKind("ValidatingAdmissionPolicy"), objs.ofKind("ValidatingAdmissionPolicyBinding")...) {
				if o.Name == name {
					got++
				}
			}
			if got != tt.want {
				t.Errorf("%d of its policy and binding, want %d", got, tt.want)
			}
		})
	}
	objs := render(t, append([]string{"--set-json", `controller.scaleTargets=[{"kind":"Deployment","group":"apps","resource":"deployments"},` +
		`{"kind":"Rollout","group":"argoproj.io","resource":"rollouts"},{"kind":"ReplicationController","group":"","resource":"replicationcontrollers"}]`}, vapAPI...)...)
	p := get[admissionv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", name)
	if len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Name != "target-named" {
		t.Errorf("matchConditions %+v, want only target-named (every requester is checked)", p.Spec.MatchConditions)
	}
	var resources string
	for _, v := range p.Spec.Variables {
		if v.Name == "resources" {
			resources = v.Expression
		}
	}
	want := "{'Deployment.apps': 'deployments', 'Rollout.argoproj.io': 'rollouts', 'ReplicationController': 'replicationcontrollers'}"
	if resources != want {
		t.Errorf("resources %s, want %s", resources, want)
	}
}
