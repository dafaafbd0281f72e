package configwatch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/controller/internal/config"
)

// Load reads the autoscaler ConfigMap ref ("namespace/name"); a missing
// one means defaults, a bad one is an error naming every bad key, and
// unknown keys are logged and ignored.
func Load(ctx context.Context, r client.Reader, ref string) (*config.Config, error) {
	cfg, unknown, err := load(ctx, r, ref)
	if err == nil {
		warnUnknown(ctx, ref, unknown)
	}
	return cfg, err
}

// load is Load without the warning: it also returns the ignored keys.
func load(ctx context.Context, r client.Reader, ref string) (*config.Config, []string, error) {
	ns, name, _ := strings.Cut(ref, "/")
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			log.FromContext(ctx).Info("autoscaler ConfigMap not found; using the defaults", "configMap", ref)
			return config.Defaults(), nil, nil
		}
		return nil, nil, fmt.Errorf("read autoscaler ConfigMap %s: %w", ref, err)
	}
	cfg, err := config.Parse(cm.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("autoscaler ConfigMap %s: %w", ref, err)
	}
	return cfg, config.UnknownKeys(cm.Data), nil
}

func warnUnknown(ctx context.Context, ref string, unknown []string) {
	if len(unknown) > 0 {
		log.FromContext(ctx).Info("autoscaler ConfigMap: ignoring keys that are no autoscaler setting (Knative ignores them too)",
			"configMap", ref, "ignored", unknown, "known", config.Keys())
	}
}

// Watcher re-reads the autoscaler ConfigMap every Period (one GET, no
// cluster-wide ConfigMap watch). A bad edit is logged with every bad key
// and the previous configuration stays in force. It runs on every
// replica, leader or not.
type Watcher struct {
	Reader client.Reader
	// Ref is the ConfigMap, "namespace/name".
	Ref string
	// Current holds the configuration in force; Start swaps in good edits.
	Current *atomic.Pointer[config.Config]
	Period  time.Duration
	// Clock ticks every Period (clock.RealClock{} in main, a fake clock
	// in tests).
	Clock clock.WithTicker

	unknown []string // the ignored keys last logged
}

// NeedLeaderElection is false: a standby replica keeps its configuration
// current too.
func (w *Watcher) NeedLeaderElection() bool { return false }

// Start refreshes on every tick until ctx ends.
func (w *Watcher) Start(ctx context.Context) error {
	t := w.Clock.NewTicker(w.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			w.refresh(ctx)
		}
	}
}

// refresh loads the ConfigMap and swaps it in if it parses. Ignored keys
// are logged when they change, not every period.
func (w *Watcher) refresh(ctx context.Context) {
	cfg, unknown, err := load(ctx, w.Reader, w.Ref)
	if err == nil && !slices.Equal(unknown, w.unknown) {
		warnUnknown(ctx, w.Ref, unknown)
		w.unknown = unknown
	}
	if err != nil {
		log.FromContext(ctx).Error(err, "autoscaler ConfigMap rejected; keeping the previous configuration", "configMap", w.Ref)
		return
	}
	if prev := w.Current.Load(); *prev != *cfg {
		log.FromContext(ctx).Info("autoscaler configuration updated", "configMap", w.Ref)
		w.Current.Store(cfg)
	}
}
