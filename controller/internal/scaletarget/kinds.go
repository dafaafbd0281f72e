package scaletarget

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// The kinds every install may scale: the controller's ClusterRole grants
// their /scale from its RBAC markers. Any other kind needs the chart to
// grant its /scale too (controller.scaleTargets).
var (
	Deployment  = schema.GroupKind{Group: "apps", Kind: "Deployment"}
	StatefulSet = schema.GroupKind{Group: "apps", Kind: "StatefulSet"}
)

// Kinds are the kinds (group and kind, any version) a PodAutoscaler may
// name as its scaleTargetRef. The controller scales a target with its own
// rights, which reach every namespace: the list is the cluster
// operator's word on which kinds that may be, so that a tenant who may
// create PodAutoscalers cannot have sockscale scale a kind nobody meant
// to hand to it (docs/security.md, "What a PodAutoscaler may scale").
type Kinds []schema.GroupKind

// DefaultKinds are Deployments and StatefulSets.
func DefaultKinds() Kinds { return Kinds{Deployment, StatefulSet} }

// kindName is how Kubernetes names kinds: an upper-case letter, then
// letters and digits.
var kindName = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// ParseKinds parses a comma-separated list of Kind.group, as kubectl
// writes a kind with its group: "Deployment.apps,StatefulSet.apps,
// Rollout.argoproj.io" (a kind of the core group has no dot:
// "ReplicationController"). Empty entries are not allowed, nor an empty
// list: with no kind at all, no PodAutoscaler could do anything.
func ParseKinds(s string) (Kinds, error) {
	var out Kinds
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		gk := schema.ParseGroupKind(entry)
		if !kindName.MatchString(gk.Kind) {
			return nil, fmt.Errorf("scale target kind %q: want Kind.group, e.g. StatefulSet.apps or Rollout.argoproj.io (the kind upper-case first, letters and digits)", entry)
		}
		if gk.Group != "" {
			if errs := validation.IsDNS1123Subdomain(gk.Group); len(errs) > 0 {
				return nil, fmt.Errorf("scale target kind %q: group %q is not a DNS subdomain: %s", entry, gk.Group, strings.Join(errs, "; "))
			}
		}
		if !slices.Contains(out, gk) {
			out = append(out, gk)
		}
	}
	return out, nil
}

// Allows says whether a PodAutoscaler may name gk. Nil Kinds are the
// default ones.
func (k Kinds) Allows(gk schema.GroupKind) bool {
	if k == nil {
		k = DefaultKinds()
	}
	return slices.Contains(k, gk)
}

// String is the list as ParseKinds reads it.
func (k Kinds) String() string {
	if k == nil {
		k = DefaultKinds()
	}
	names := make([]string, len(k))
	for i, gk := range k {
		names[i] = gk.String()
	}
	return strings.Join(names, ",")
}

// GroupVersionKind is the kind a scaleTargetRef names, or why it names
// none.
func GroupVersionKind(ref v1alpha1.ScaleTargetRef) (schema.GroupVersionKind, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil || gv.Version == "" {
		return schema.GroupVersionKind{}, fmt.Errorf("scaleTargetRef.apiVersion %q: want group/version, e.g. apps/v1 (or v1 for the core group)", ref.APIVersion)
	}
	if !kindName.MatchString(ref.Kind) {
		return schema.GroupVersionKind{}, fmt.Errorf("scaleTargetRef.kind %q: want a kind, e.g. Deployment or StatefulSet", ref.Kind)
	}
	return gv.WithKind(ref.Kind), nil
}
