package revision

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// ReasonFieldNotAllowed is Ready's reason (and PodSpecAllowed's) when a
// Revision uses a pod-spec field the cluster's configuration does not
// allow.
const ReasonFieldNotAllowed = "FieldNotAllowed"

// ConditionPodSpecAllowed is False while a Revision uses a pod-spec field
// the configuration does not allow, and absent otherwise. It is how a
// Revision whose Deployment was made before its key was turned off says
// so: that Deployment is left running, so its Ready stays what its pods
// say.
const ConditionPodSpecAllowed = "PodSpecAllowed"

// never is the key of a field no key allows: the CRDs' CEL rules refuse
// it at once, and the controller again for Revisions stored before those
// rules existed.
const never = ""

// violation is one field of a Revision's spec the configuration does not
// allow: its path and the ConfigMap key that would allow it.
type violation struct {
	path, key string
}

func (v violation) String() string {
	if v.key == never {
		return v.path + " is never allowed"
	}
	return fmt.Sprintf("%s needs %s: enabled in the autoscaler ConfigMap", v.path, v.key)
}

// Safe subsets of securityContext, by JSON field name: Knative's default
// container fields and pod fields, always allowed. privileged and
// procMount are allowed only as false and Default (checked apart); any
// other field needs podspec-securitycontext. Listing what is allowed,
// not what is not, keeps a field a later Kubernetes adds out until
// someone decides about it.
var (
	safeContainerSecurity = []string{"allowPrivilegeEscalation", "capabilities", "privileged", "procMount", "readOnlyRootFilesystem",
		"runAsGroup", "runAsNonRoot", "runAsUser", "seccompProfile"}
	safePodSecurity = []string{"fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot", "runAsUser", "seccompProfile", "supplementalGroups"}
)

// volumeSource is a kind of volume a Revision may use: the key it needs
// (never: none) and whether f allows it.
type volumeSource struct {
	key     string
	allowed func(f config.PodSpec) bool
}

func always(config.PodSpec) bool { return true }

// volumeSources are the volume kinds a Revision may use, by JSON name;
// the CRD refuses any other.
var volumeSources = map[string]volumeSource{
	"configMap":             {never, always},
	"secret":                {never, always},
	"projected":             {never, always},
	"downwardAPI":           {never, always},
	"emptyDir":              {config.KeyVolumesEmptyDir, func(f config.PodSpec) bool { return f.VolumesEmptyDir }},
	"hostPath":              {config.KeyVolumesHostPath, func(f config.PodSpec) bool { return f.VolumesHostPath }},
	"persistentVolumeClaim": {config.KeyPersistentVolumeClaim, func(f config.PodSpec) bool { return f.PersistentVolumeClaim }},
}

// notAllowed lists the fields of spec that f does not allow, in spec
// order.
func notAllowed(spec *servingv1alpha1.RevisionSpec, f config.PodSpec) []violation {
	var out []violation
	add := func(allowed bool, path, key string) {
		if !allowed {
			out = append(out, violation{path, key})
		}
	}
	for i, v := range spec.Volumes {
		path := fmt.Sprintf("spec.volumes[%d]", i)
		for _, name := range jsonFields(v.VolumeSource) {
			src, known := volumeSources[name]
			add(known && src.allowed(f), path+"."+name, src.key) // unknown: key never
		}
	}
	add(len(spec.NodeSelector) == 0 || f.NodeSelector, "spec.nodeSelector", config.KeyNodeSelector)
	add(len(spec.Tolerations) == 0 || f.Tolerations, "spec.tolerations", config.KeyTolerations)
	if sc := spec.SecurityContext; sc != nil {
		for _, name := range jsonFields(sc) {
			add(slices.Contains(safePodSecurity, name) || f.SecurityContext, "spec.securityContext."+name, config.KeySecurityContext)
		}
		add(!unconfined(sc.SeccompProfile) || f.SecurityContext, "spec.securityContext.seccompProfile.type", config.KeySecurityContext)
		add(sc.WindowsOptions == nil || !isTrue(sc.WindowsOptions.HostProcess), "spec.securityContext.windowsOptions.hostProcess", never)
	}
	for i, c := range spec.Containers {
		if c.SecurityContext != nil {
			out = append(out, containerNotAllowed(fmt.Sprintf("spec.containers[%d].securityContext", i), c.SecurityContext, f)...)
		}
	}
	return out
}

func containerNotAllowed(path string, sc *corev1.SecurityContext, f config.PodSpec) []violation {
	var out []violation
	add := func(allowed bool, path, key string) {
		if !allowed {
			out = append(out, violation{path, key})
		}
	}
	for _, name := range jsonFields(sc) {
		add(slices.Contains(safeContainerSecurity, name) || f.SecurityContext, path+"."+name, config.KeySecurityContext)
	}
	add(!isTrue(sc.Privileged), path+".privileged", never)
	add(sc.ProcMount == nil || *sc.ProcMount == corev1.DefaultProcMount, path+".procMount", never)
	add(sc.WindowsOptions == nil || !isTrue(sc.WindowsOptions.HostProcess), path+".windowsOptions.hostProcess", never)
	add(!unconfined(sc.SeccompProfile) || f.SecurityContext, path+".seccompProfile.type", config.KeySecurityContext)
	if sc.Capabilities != nil && !f.AddCapabilities {
		for j, c := range sc.Capabilities.Add {
			add(c == "NET_BIND_SERVICE", fmt.Sprintf("%s.capabilities.add[%d] (%s)", path, j, c), config.KeyAddCapabilities)
		}
	}
	return out
}

// jsonFields are the names of v's fields that are set, as they appear in
// JSON (v a struct or a pointer to one), sorted.
func jsonFields(v any) []string {
	b, err := json.Marshal(v)
	if err != nil {
		// Kubernetes API types always marshal; if one did not, every
		// field counts as set under a name that allows nothing.
		return []string{"<unreadable>"}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return []string{"<unreadable>"}
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

func unconfined(p *corev1.SeccompProfile) bool {
	return p != nil && p.Type == corev1.SeccompProfileTypeUnconfined
}

func isTrue(b *bool) bool { return b != nil && *b }

// fieldsNotAllowed says which fields of spec f does not allow, "" when
// it allows them all.
func fieldsNotAllowed(spec *servingv1alpha1.RevisionSpec, f config.PodSpec) string {
	vs := notAllowed(spec, f)
	msgs := make([]string, len(vs))
	for i, v := range vs {
		msgs[i] = v.String()
	}
	return strings.Join(msgs, "; ")
}
