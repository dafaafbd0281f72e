package e2etest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/test/stack"
)

// RequireHelm skips t (fails it under CI=true) unless $HELM names the
// pinned helm, which `make test-e2e` builds.
func RequireHelm(t *testing.T) {
	t.Helper()
	for _, need := range []string{stack.HelmFromEnv()} {
		if _, err := os.Stat(need); need == "" || err != nil {
			msg := fmt.Sprintf("%q missing: run through `make test-e2e` (builds the cluster's binaries and helm)", need)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg + "; CI=true forbids skipping")
			}
			t.Skip(msg)
		}
	}
}

// Eventually calls f every 500 ms until it returns nil, and fails t with
// f's last error once timeout has passed.
func Eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	Poll(t, timeout, 500*time.Millisecond, what, f)
}

// Poll calls f every step until it returns nil, and fails t with f's last
// error once timeout has passed.
func Poll(t *testing.T, timeout, step time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(step)
	}
}

// Deploy makes the app name in namespace ns (stack.Stack.Deploy), waits
// for its first ready pod, then until answers(url) returns nil for its
// public URL, and returns that URL. Each wait lasts two minutes at most:
// on a loaded machine the first target after the chart waits for the
// activators and kube-proxy's first sync of its Service.
func Deploy(t *testing.T, s *stack.Stack, ns, name string, spec func(*v1alpha1.PodAutoscalerSpec), answers func(url string) error) string {
	t.Helper()
	return DeployApp(t, s, stack.App{Namespace: ns, Name: name, Spec: spec}, answers)
}

// DeployApp is Deploy for an app with more than its PodAutoscaler's spec
// set (its pods' spec, its image).
func DeployApp(t *testing.T, s *stack.Stack, app stack.App, answers func(url string) error) string {
	t.Helper()
	ctx := context.Background()
	ns, name := app.Namespace, app.Name
	if err := s.Deploy(ctx, app); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, name+" has a ready pod", func() error {
		d, err := s.Deployment(ctx, ns, name)
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas < 1 {
			return fmt.Errorf("%d ready", d.Status.ReadyReplicas)
		}
		return nil
	})
	url, err := s.PublicURL(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, name+"'s public Service answers", func() error { return answers(url) })
	return url
}
