package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
)

// TestE2EScaleToZeroAndBack: an idle target goes to Proxy mode, the
// activator answers the controller's probe, and the last pod goes; then
// requests that arrive at zero are held by the activator, wake the target
// (poke -> /scale -> pod -> ready) and are all answered 200; the target
// goes back to zero when idle again.
func TestE2EScaleToZeroAndBack(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	// A 10 s window: idle is noticed fast; then Proxy mode, and the last
	// pod goes after the grace period.
	url := deploy(t, s, "zero", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Window = &metav1.Duration{Duration: 10 * time.Second}
		p.MaxScale = ptr.To(int32(3))
	})
	atZero := func(what string) {
		t.Helper()
		// Idle for the window, then the grace period (30 s) in Proxy mode.
		e2etest.Eventually(t, 3*time.Minute, what, func() error {
			pa, err := s.PA(ctx, appNS, "zero")
			if err != nil {
				return err
			}
			if got := replicas(t, s, "zero"); got != 0 || pa.Status.Mode != v1alpha1.ModeProxy {
				return fmt.Errorf("%d pods wanted: %s", got, paLine(t, s, "zero"))
			}
			d, err := s.Deployment(ctx, appNS, "zero")
			if err != nil {
				return err
			}
			if d.Status.Replicas != 0 {
				return fmt.Errorf("the Deployment still has %d pods", d.Status.Replicas)
			}
			return nil
		})
		t.Logf("%s: %s", what, paLine(t, s, "zero"))
	}
	atZero("scaled to zero while idle")

	// Ten requests arrive at once, at zero: each is held until a pod is
	// ready, then answered by it.
	client := &http.Client{Timeout: 2 * time.Minute}
	start := time.Now()
	var wg sync.WaitGroup
	codes := make([]int, 10)
	errs := make([]error, 10)
	bodies := make([]string, 10)
	for i := range codes {
		wg.Go(func() {
			resp, err := client.Get(url)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			codes[i], bodies[i] = resp.StatusCode, string(b)
		})
	}
	wg.Wait()
	coldStart := time.Since(start)
	for i := range codes {
		if errs[i] != nil || codes[i] != http.StatusOK {
			t.Errorf("request %d at zero: %d %q %v, want 200 from a pod", i, codes[i], strings.TrimSpace(bodies[i]), errs[i])
		}
	}
	t.Logf("10 requests at zero answered in %s: %s", coldStart.Round(time.Millisecond), paLine(t, s, "zero"))
	if got := replicas(t, s, "zero"); got < 1 {
		t.Errorf("after requests at zero the target wants %d pods", got)
	}

	atZero("back to zero when idle again")
}
