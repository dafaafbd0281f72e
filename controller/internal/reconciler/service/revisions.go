package service

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TemplateHashAnnotation is on every Revision a Service makes: the hash of
// the template it was made from, so an unchanged template finds its
// Revision again and makes no new one. (The Revision reconciler does not
// copy serving.sockscale.dev/ annotations to pods.)
const TemplateHashAnnotation = "serving.sockscale.dev/template-hash"

// TemplateHash is a hash of the whole template, metadata included (a new
// name or annotation is a new Revision, as in Knative): sha256 of its JSON
// (encoding/json sorts map keys), the first 16 hex digits.
func TemplateHash(t *servingv1alpha1.RevisionTemplateSpec) (string, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hash the template: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16], nil
}

// numbered matches a Revision name <service>-<number of 5 or more digits>.
func numbered(service string) *regexp.Regexp {
	return regexp.MustCompile("^" + regexp.QuoteMeta(service) + `-([0-9]{5,})$`)
}

// NextName is the name of a Service's next numbered Revision:
// <service>-00001, or one more than the highest number among existing,
// whoever made them (so a hand-made hello-00003 is not collided with).
func NextName(service string, existing []string) string {
	re, highest := numbered(service), 0
	for _, n := range existing {
		if m := re.FindStringSubmatch(n); m != nil {
			if v, err := strconv.Atoi(m[1]); err == nil && v > highest {
				highest = v
			}
		}
	}
	return fmt.Sprintf("%s-%05d", service, highest+1)
}

// MakeRevision is the Revision of svc's template: the template's labels
// and annotations, the service label and the template's hash, and its
// spec. The caller sets the controller reference.
func MakeRevision(svc *servingv1alpha1.Service, name, hash string) *servingv1alpha1.Revision {
	t := svc.Spec.Template.DeepCopy()
	labels := maps.Clone(t.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[servingv1alpha1.ServiceLabelKey] = svc.Name
	annotations := maps.Clone(t.Metadata.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[TemplateHashAnnotation] = hash
	return &servingv1alpha1.Revision{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name, Labels: labels, Annotations: annotations},
		Spec:       t.Spec,
	}
}

// newestReady is the newest (by creation time, then name) of revs whose
// Ready is True, or "".
func newestReady(revs []servingv1alpha1.Revision) string {
	sorted := append([]servingv1alpha1.Revision(nil), revs...)
	sort.Slice(sorted, func(i, j int) bool { return newer(&sorted[i], &sorted[j]) })
	for i := range sorted {
		if meta.IsStatusConditionTrue(sorted[i].Status.Conditions, names.ConditionReady) {
			return sorted[i].Name
		}
	}
	return ""
}

// newer: a was created after b (names break ties: -00010 after -00009).
func newer(a, b *servingv1alpha1.Revision) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	if len(a.Name) != len(b.Name) {
		return len(a.Name) > len(b.Name)
	}
	return a.Name > b.Name
}
