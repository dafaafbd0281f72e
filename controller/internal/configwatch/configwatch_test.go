package configwatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/controller/internal/config"
)

func configMap(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "sockscale-autoscaler"}, Data: data}
}

func TestLoad(t *testing.T) {
	ctx := context.Background()
	cfg, err := Load(ctx, fake.NewClientBuilder().Build(), "ops/sockscale-autoscaler")
	if err != nil || *cfg != *config.Defaults() {
		t.Errorf("without the ConfigMap: %+v, %v; want the defaults", cfg, err)
	}
	cfg, err = Load(ctx, fake.NewClientBuilder().WithObjects(configMap(map[string]string{"stable-window": "30s"})).Build(), "ops/sockscale-autoscaler")
	if err != nil || cfg.StableWindow != 30*time.Second {
		t.Errorf("stable-window 30s: %+v, %v", cfg, err)
	}
	// Knative's key for the autoscaler class means nothing here: ignored.
	cfg, err = Load(ctx, fake.NewClientBuilder().WithObjects(configMap(map[string]string{"stable-window": "30s", "pod-autoscaler-class": "kpa.autoscaling.knative.dev"})).Build(), "ops/sockscale-autoscaler")
	if err != nil || cfg.StableWindow != 30*time.Second {
		t.Errorf("with pod-autoscaler-class: %+v, %v; want it ignored", cfg, err)
	}
	_, err = Load(ctx, fake.NewClientBuilder().WithObjects(configMap(map[string]string{"stable-window": "2s"})).Build(), "ops/sockscale-autoscaler")
	if err == nil {
		t.Error("stable-window 2s: no error")
	}
}

func TestConfigWatcherKeepsPreviousOnBadEdit(t *testing.T) {
	cm := configMap(map[string]string{"stable-window": "30s"})
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	var current atomic.Pointer[config.Config]
	current.Store(config.Defaults())
	w := &Watcher{Reader: c, Ref: "ops/sockscale-autoscaler", Current: &current, Period: time.Second}
	ctx := context.Background()

	w.refresh(ctx)
	if got := current.Load().StableWindow; got != 30*time.Second {
		t.Fatalf("after a good edit the stable window is %v, want 30s", got)
	}
	cm.Data = map[string]string{"stable-window": "2s"}
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	w.refresh(ctx)
	if got := current.Load().StableWindow; got != 30*time.Second {
		t.Errorf("after a bad edit the stable window is %v, want the previous 30s", got)
	}
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	w.refresh(ctx)
	if got := current.Load().StableWindow; got != time.Minute {
		t.Errorf("without the ConfigMap the stable window is %v, want the default 1m", got)
	}
}

// TestWatcherRefreshesOnTicks: an edit is picked up on the clock's next
// tick (10 s period: not at 9 s, at 10 s), and Start returns when its
// context ends.
func TestWatcherRefreshesOnTicks(t *testing.T) {
	cm := configMap(map[string]string{"stable-window": "30s"})
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	var current atomic.Pointer[config.Config]
	current.Store(config.Defaults())
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	w := &Watcher{Reader: c, Ref: "ops/sockscale-autoscaler", Current: &current, Period: 10 * time.Second, Clock: clk}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond) // until Start has its ticker
	}

	clk.Step(9 * time.Second)
	time.Sleep(50 * time.Millisecond)
	if got := current.Load().StableWindow; got != time.Minute {
		t.Fatalf("at 9 s the stable window is %v, want the default 1m (no tick yet)", got)
	}
	clk.Step(time.Second)
	for deadline := time.Now().Add(5 * time.Second); current.Load().StableWindow != 30*time.Second; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("at 10 s the stable window is %v, want 30s from the ConfigMap", current.Load().StableWindow)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}
