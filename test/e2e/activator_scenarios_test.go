package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EActivatorDeadline: a request for a target whose pod never
// becomes ready is held for the target's timeoutSeconds (2), then
// answered 504 with a body naming the target and the timeout.
func TestE2EActivatorDeadline(t *testing.T) {
	s := up(t)
	const name = "never"
	url := deployUnready(t, s, stack.App{Name: name, Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.TimeoutSeconds = ptr(int32(2))
	}})
	a := get(oneShotClient(time.Minute), url)
	t.Logf("a request for %s/%s (image %s, timeoutSeconds 2): %s after %s", appNS, name, unknownImage, a, a.took.Round(time.Millisecond))
	if a.err != nil || a.code != http.StatusGatewayTimeout {
		t.Fatalf("got %s, want 504", a)
	}
	for _, want := range []string{appNS + "/" + name, "2s"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("the 504's body %q does not say %q", strings.TrimSpace(a.body), want)
		}
	}
	if a.took < 2*time.Second || a.took > 4*time.Second {
		t.Errorf("answered after %s, want about the timeout (2 s)", a.took)
	}
}
