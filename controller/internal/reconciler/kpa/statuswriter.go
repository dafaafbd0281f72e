package kpa

import (
	"context"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// statusWriter writes PodAutoscalers' statuses apart from their
// decisions, the latest status of each target only: with the API server
// slow, a decision that waited for its own status write (a few ms, and
// seconds under load: 7 of 8 workers were found in Status().Update at
// 3,000 targets) made every other target late. A status not yet written
// when the next tick comes is replaced by that tick's.
type statusWriter struct {
	client  client.Client
	workers int
	queue   workqueue.TypedInterface[client.ObjectKey]

	mu      sync.Mutex
	pending map[client.ObjectKey]*v1alpha1.PodAutoscaler
}

func newStatusWriter(c client.Client, workers int) *statusWriter {
	return &statusWriter{client: c, workers: workers, queue: workqueue.NewTyped[client.ObjectKey](),
		pending: map[client.ObjectKey]*v1alpha1.PodAutoscaler{}}
}

// write queues pa (with the status to write) in place of any status of
// it still waiting.
func (w *statusWriter) write(pa *v1alpha1.PodAutoscaler) {
	key := client.ObjectKeyFromObject(pa)
	w.mu.Lock()
	w.pending[key] = pa
	w.mu.Unlock()
	w.queue.Add(key)
}

// NeedLeaderElection is false: it writes for the reconciler wherever
// that runs (every replica with buckets), and idles elsewhere.
func (w *statusWriter) NeedLeaderElection() bool { return false }

// Start runs the writers until ctx ends (manager.Runnable).
func (w *statusWriter) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() {
			for w.writeNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	return nil
}

// writeNext writes one queued status; false when the queue is shut down.
// A conflict (the PodAutoscaler changed since its tick read it) or a
// failure drops the write: the next tick, 2 s on, finds the status still
// old and writes it again.
func (w *statusWriter) writeNext(ctx context.Context) bool {
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	pa := w.pending[key]
	delete(w.pending, key)
	w.mu.Unlock()
	if pa == nil {
		return true
	}
	if err := w.client.Status().Update(ctx, pa); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		log.FromContext(ctx).Error(err, "update status", "podautoscaler", key.String())
	}
	return true
}
