package statsauth

import (
	"context"
	"fmt"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// APIReviewer asks the API server with TokenReviews and
// SubjectAccessReviews.
type APIReviewer struct{ Client client.Client }

var _ Reviewer = APIReviewer{}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// ReviewToken creates a TokenReview of token for audience.
func (r APIReviewer) ReviewToken(ctx context.Context, token, audience string) (authnv1.TokenReviewStatus, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{audience}}}
	if err := r.Client.Create(ctx, tr); err != nil {
		return authnv1.TokenReviewStatus{}, fmt.Errorf("create TokenReview: %w", err)
	}
	return tr.Status, nil
}

// Allowed creates a SubjectAccessReview: may user create resource in Group?
func (r APIReviewer) Allowed(ctx context.Context, user authnv1.UserInfo, resource string) (bool, string, error) {
	extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{Group: Group, Resource: resource, Verb: Verb},
	}}
	if err := r.Client.Create(ctx, sar); err != nil {
		return false, "", fmt.Errorf("create SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed && !sar.Status.Denied, sar.Status.Reason, nil
}
